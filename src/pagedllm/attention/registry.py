"""Attention backend registry: backend name → lazily imported factory; the platform names
the backend a device and dtype get (platform/interface.py `attention_backend`).

Only the chosen backend's module is imported, so CPU runs never import CUDA libraries.
This module holds no state beyond the static name table.
"""

from __future__ import annotations

import importlib

import torch

from pagedllm.attention.backend import AttentionBackend
from pagedllm.platform import get_platform

# name → (module, class); imported only when selected.
_BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("pagedllm.attention.torch_paged", "TorchPagedBackend"),
    "torch_grouped": ("pagedllm.attention.torch_grouped", "TorchGroupedBackend"),
    "cpu": ("pagedllm.attention.cpu_paged", "CpuPagedBackend"),
    "triton": ("pagedllm.attention.triton_paged", "TritonPagedBackend"),
}


def available_backends() -> list[str]:
    """Names that `create_attention_backend` accepts."""
    return sorted(_BACKENDS)


def create_attention_backend(name: str) -> AttentionBackend:
    """Instantiate the backend registered under `name`."""
    if name not in _BACKENDS:
        raise ValueError(
            f"Unknown attention backend {name!r}; available: {', '.join(available_backends())}."
        )
    module_name, class_name = _BACKENDS[name]
    backend_cls = getattr(importlib.import_module(module_name), class_name)
    return backend_cls()


def backend_name_for_device(device: str, dtype: torch.dtype = torch.float32) -> str:
    """Default backend for a device string ("cpu", "cuda", "cuda:0", ...) and model dtype,
    as its platform chooses: PAGEDLLM_ATTENTION_BACKEND names one outright (vLLM's
    VLLM_ATTENTION_BACKEND); else on CPU the C kernels ("cpu") when they are built for this
    machine, not switched off (PAGEDLLM_ATTENTION_KERNEL=torch) and serve the dtype, on CUDA
    the Triton kernel when triton is installed, and torch's grouped backend otherwise (the
    plain "torch" backend is the reference, named outright).
    """
    chosen = get_platform(device).attention_backend(dtype)
    if chosen not in _BACKENDS:
        raise ValueError(
            f"PAGEDLLM_ATTENTION_BACKEND={chosen!r} is not a backend; available: "
            f"{', '.join(available_backends())}."
        )
    return chosen


def get_attention_backend(device: str, dtype: torch.dtype = torch.float32) -> AttentionBackend:
    """The default attention backend for `device` and a model of `dtype`."""
    return create_attention_backend(backend_name_for_device(device, dtype))
