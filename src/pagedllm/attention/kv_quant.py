"""The int8 KV cache format (`kv_cache_dtype="int8"`): codes with a scale per 16 values.

A cache row is one position's K (or V) for one kv head: D values. In the int8 cache it is
stored as D int8 codes followed by D / 16 float32 scales, one per group of 16 values
(value = code * scale, scale = max |x| / 127 over the group): D + D / 4 bytes, 62.5% of a
bf16 row. A scale per 16 values rather than per row matters for keys: a few channels of a
rotated key are much larger than the rest, and with one scale per row they set the step of
every value. Measured against the file's float32 math (benchmarks/accuracy.py, 2,048
positions per text set), per-16 scales took most of the int8 cache's extra error away.

These are the torch reference ops (any device); on CPU the C library writes rows with the
same float32 operations (kernels/csrc/paged_attention.c) and its kernels read them directly.
"""

from __future__ import annotations

import torch

from pagedllm.config import KV_INT8_GROUP

SCALE_BYTES = 4  # a float32 scale
GROUP = KV_INT8_GROUP  # values per scale
_LEVELS = 127.0
_STEP = 1.0 / _LEVELS  # a scale is max |x| * _STEP, as the C writer computes it


def cache_row_size(head_size: int) -> int:
    """Bytes of one int8 cache row of `head_size` values.

    Raises:
        ValueError: when `head_size` is not a multiple of the scale group.
    """
    if head_size % GROUP:
        raise ValueError(
            f"kv_cache_dtype='int8' needs a head size that is a multiple of {GROUP}, got "
            f"{head_size}; use kv_cache_dtype='auto'."
        )
    return head_size + SCALE_BYTES * (head_size // GROUP)


def cache_shape(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    cache_dtype: str = "auto",
) -> tuple[int, ...]:
    """The paged layout of one layer's cache, [2 (K, V), num_blocks, block_size,
    num_kv_heads, row]: a row is head_size values, or for "int8" head_size codes and their
    float32 scales."""
    row = cache_row_size(head_size) if cache_dtype == "int8" else head_size
    return (2, num_blocks, block_size, num_kv_heads, row)


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., D] values → [..., D + D / 4] int8 rows (codes, then the float32 scales' bytes)."""
    cache_row_size(x.shape[-1])
    groups = x.float().unflatten(-1, (-1, GROUP))  # [..., D / 16, 16]
    amax = groups.abs().amax(dim=-1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    # A true float32 division, as the C writer's: torch computes `scalar / tensor` as the
    # scalar times a rounded reciprocal, which rounds ties at x.5 the other way.
    inv = torch.where(amax > 0, torch.full_like(safe, _LEVELS) / safe, torch.zeros_like(amax))
    codes = (groups * inv).round_().clamp_(-_LEVELS, _LEVELS).to(torch.int8).flatten(-2)
    scales = (amax * _STEP).squeeze(-1).contiguous().view(torch.int8)  # [..., D / 4] bytes
    return torch.cat([codes, scales], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + D / 4] int8 rows → [..., D] values in `dtype` (computed in float32)."""
    head_size = rows.shape[-1] * GROUP // (GROUP + SCALE_BYTES)
    scales = rows[..., head_size:].contiguous().view(torch.float32)  # [..., D / 16]
    codes = rows[..., :head_size].float().unflatten(-1, (-1, GROUP))
    return (codes * scales.unsqueeze(-1)).flatten(-2).to(dtype)


def round_trip(x: torch.Tensor) -> torch.Tensor:
    """`x` as the int8 cache will give it back (what attention reads for cached tokens)."""
    return dequantize_rows(quantize_rows(x), x.dtype)


def store_rows(
    kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> torch.Tensor:
    """Write the step's K/V [T, Hkv, D] as int8 rows into a cache of rows
    [2, num_blocks, block_size, Hkv, D + D / 4] at `slot_mapping`; returns the rows
    [2, T, Hkv, D + D / 4] (no host sync)."""
    rows = quantize_rows(torch.stack([key, value]))  # [2, T, Hkv, row]
    kv_cache.view(2, -1, *rows.shape[2:]).index_copy_(1, slot_mapping, rows)
    return rows


def convert_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows of one KV cache dtype as another's (a KV connector's peer may keep an int8
    cache where this one keeps bfloat16, or the reverse): int8 rows are dequantized, values
    quantized for an int8 cache, else cast (through float32)."""
    if rows.dtype == dtype:
        return rows
    values = dequantize_rows(rows, torch.float32) if rows.dtype == torch.int8 else rows.float()
    return quantize_rows(values) if dtype == torch.int8 else values.to(dtype)
