"""The platform: each device kind's capabilities, read once, and the engine's choices on it
(vLLM's `current_platform`). See interface.py; `python -m pagedllm.platform` prints this
machine's.

A leaf below everything but the kernels' loader: layers, attention, models, the worker and
the engine args ask it; it asks none of them.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from pagedllm.platform.interface import Platform

if TYPE_CHECKING:
    import torch

    from pagedllm.platform.cpu import CpuPlatform

__all__ = ["Platform", "cpu_platform", "current_platform", "device_type_of", "get_platform"]


def device_type_of(device: str | torch.device) -> str:
    """"cuda" for "cuda:1" or torch.device("cuda", 1), etc."""
    return str(device).split(":", 1)[0]


@cache
def _platform_of(device_type: str) -> Platform:
    if device_type == "cpu":
        from pagedllm.platform.cpu import CpuPlatform

        return CpuPlatform()
    if device_type == "cuda":
        from pagedllm.platform.cuda import CudaPlatform

        return CudaPlatform()
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device_type!r}.")


def get_platform(device: str | torch.device) -> Platform:
    """The platform of a device ("cpu", "cuda", "cuda:0", or a torch.device)."""
    return _platform_of(device_type_of(device))


def cpu_platform() -> CpuPlatform:
    """The CPU's platform (the C kernels' owner)."""
    return _platform_of("cpu")  # type: ignore[return-value]


@cache
def current_platform() -> Platform:
    """The default device's platform: CUDA when torch sees a GPU, else the CPU."""
    import torch

    return get_platform("cuda" if torch.cuda.is_available() else "cpu")
