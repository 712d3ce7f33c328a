"""The int8 KV cache format (`kv_cache_dtype="int8"`): rows of codes with their own scale.

A cache row is one position's K (or V) for one kv head: D values. In the int8 cache it is
stored as D int8 codes followed by the float32 scale of that row, D + 4 bytes in all
(value = code * scale, scale = max |x| / 127). One scale per row of D values keeps the
error at most half a step of the row's own range, so the measured next-token agreement with
float32 is that of the bf16 cache (BENCHMARKS.md); the cache takes 53% of bf16's memory for
D = 64 and reads half the bytes per decode step.

These are the torch reference ops (any device); on CPU the C library writes rows with the
same float32 operations (csrc/paged_attention.c) and the decode kernel reads them directly.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # one float32 scale per row
_LEVELS = 127.0
_STEP = 1.0 / _LEVELS  # a scale is max |x| * _STEP, as the C writer computes it


def cache_row_size(head_size: int) -> int:
    """Bytes of one int8 cache row of `head_size` values."""
    return head_size + SCALE_BYTES


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., D] values → [..., D + 4] int8 rows (codes, then the float32 scale's bytes)."""
    values = x.float()
    amax = values.abs().amax(dim=-1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv = torch.where(amax > 0, _LEVELS / safe, torch.zeros_like(amax))
    codes = (values * inv).round_().clamp_(-_LEVELS, _LEVELS).to(torch.int8)
    scale = (amax * _STEP).view(torch.int8)  # [..., 4]: the float32's bytes
    return torch.cat([codes, scale], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 4] int8 rows → [..., D] values in `dtype` (computed in float32)."""
    head_size = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_size:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :head_size].float() * scale).to(dtype)


def round_trip(x: torch.Tensor) -> torch.Tensor:
    """`x` as the int8 cache will give it back (what attention reads for cached tokens)."""
    return dequantize_rows(quantize_rows(x), x.dtype)
