"""Dtype names to torch dtypes (device facts live in pagedllm.platform)."""

from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_torch_dtype(name: str) -> torch.dtype:
    """Map a resolved dtype name ("float32", "bfloat16", "float16") to torch's dtype."""
    return _DTYPES[name]
