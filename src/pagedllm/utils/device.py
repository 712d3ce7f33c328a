"""Device and dtype resolution, and memory queries (CPU and CUDA, CUDA imported lazily)."""

from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_torch_dtype(name: str) -> torch.dtype:
    """Map a resolved dtype name ("float32", "bfloat16", "float16") to torch's dtype."""
    return _DTYPES[name]


def cuda_free_memory_bytes() -> tuple[int, int]:
    """(free, total) bytes of the current CUDA device."""
    return torch.cuda.mem_get_info()
