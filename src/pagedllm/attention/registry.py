"""Attention backend registry: backend name → lazily imported factory, picked by device.

Only the chosen backend's module is imported, so CPU runs never import CUDA libraries.
This module holds no state beyond the static name table.
"""

from __future__ import annotations

import importlib

from pagedllm.attention.backend import AttentionBackend

# name → (module, class); imported only when selected.
_BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("pagedllm.attention.torch_paged", "TorchPagedBackend"),
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


def backend_name_for_device(device: str) -> str:
    """Default backend for a device string ("cpu", "cuda", "cuda:0", ...).

    CUDA would pick a flash backend once one is registered; until then every device uses
    the portable torch backend.
    """
    device_type = device.split(":", 1)[0]
    if device_type == "cuda" and "flash" in _BACKENDS:
        return "flash"
    return "torch"


def get_attention_backend(device: str) -> AttentionBackend:
    """The default attention backend for `device`."""
    return create_attention_backend(backend_name_for_device(device))
