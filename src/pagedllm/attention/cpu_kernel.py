"""The C attention kernels for CPUs (csrc/paged_attention.c): build, load and call them.

The same library writes new K/V rows into the int8 cache (see kv_quant.py), one call per
layer instead of a dozen torch ops.

The decode kernel reads each decoding request's context straight out of the paged cache, so
no dense copy of any context is made (the torch path needs one: a gather, or the contexts it
keeps across steps, which double the KV memory); the prefill kernel does the same for the
new tokens of prefilling requests, causally. The library is compiled on first use for this
machine's instruction set (the kernels package). Without a C compiler, or with
PAGEDLLM_ATTENTION_KERNEL=torch, attention stays on the torch path.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from pagedllm.attention import kv_quant
from pagedllm.kernels import pointer
from pagedllm.kernels.abi import PagedDims
from pagedllm.platform import cpu_platform, get_platform

# Decode functions by (query dtype, cache dtype); int8 writers by K/V dtype.
_FUNCTIONS = {
    (torch.float32, torch.float32): "paged_decode_f32",
    (torch.bfloat16, torch.bfloat16): "paged_decode_bf16",
    (torch.float32, torch.int8): "paged_decode_f32_int8",
    (torch.bfloat16, torch.int8): "paged_decode_bf16_int8",
}
# Prefill functions, keyed the same way.
_PREFILL_FUNCTIONS = {key: name.replace("decode", "prefill") for key, name in _FUNCTIONS.items()}
_STORE_FUNCTIONS = {torch.float32: "store_int8_f32", torch.bfloat16: "store_int8_bf16"}


def _library() -> Any:
    """The kernel library's handle (the platform said the kernels serve: is_available)."""
    library = cpu_platform().kernel_library()
    return None if library is None else library.lib


def is_available(dtype: torch.dtype, device: torch.device | str = "cpu") -> bool:
    """True when the C kernel can serve attention for this query dtype on `device` (over a
    cache of the same dtype or int8): the platform's answer."""
    return get_platform(device).attention_kernels(dtype)


def can_store_int8(dtype: torch.dtype, device: torch.device | str = "cpu") -> bool:
    """True when the C library can write K/V of this dtype into an int8 cache there."""
    return dtype in _STORE_FUNCTIONS and is_available(dtype, device)


def _call_setup(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    window: int | None,
) -> tuple[Any, PagedDims]:
    """The library and the cache/query shape (and window: 0 for none) a kernel call takes."""
    library = _library()
    assert library is not None, "call is_available() first"
    _, num_blocks, block_size, num_kv_heads, _ = kv_cache.shape
    _check_row(kv_cache, query.shape[2])
    dims = PagedDims(
        num_blocks, block_size, num_kv_heads, query.shape[1], query.shape[2],
        block_tables.shape[1], window or 0,
    )
    return library, dims


def paged_decode_attention(
    out: torch.Tensor,  # [num_tokens, H, D], written at token_rows
    query: torch.Tensor,  # [num_tokens, H, D] contiguous
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, row] contiguous
    block_tables: torch.Tensor,  # [n, max_blocks] int32 contiguous
    seq_lens: torch.Tensor,  # [n] int32
    token_rows: torch.Tensor,  # [n] int32
    max_seq_len: int,
    scale: float,
    window: int | None = None,
) -> None:
    """Attend the query rows `token_rows` to their paged contexts (the last `window`
    positions of them, when given); write `out` there."""
    library, dims = _call_setup(query, kv_cache, block_tables, window)
    failed = getattr(library, _FUNCTIONS[(query.dtype, kv_cache.dtype)])(
        ctypes.byref(dims),
        pointer(query),
        pointer(out),
        pointer(kv_cache),
        pointer(block_tables),
        pointer(seq_lens),
        pointer(token_rows),
        seq_lens.shape[0],
        max_seq_len,
        scale,
    )
    if failed:
        raise MemoryError("CPU decode attention could not allocate its score buffers.")


def dense_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> torch.Tensor:
    """Bidirectional attention over [B, N, H, D] bfloat16 tensors (token-major, each token's
    heads side by side: a linear layer's output viewed as heads), every token of an item
    attending to all of that item's tokens (a vision tower's image): [B, N, H, D] out.
    Call is_available(torch.bfloat16) first (the platform's dense_attention_kernel says
    where it beats torch's)."""
    library = _library()
    assert library is not None, "call is_available() first"
    if any(t.dtype != torch.bfloat16 for t in (query, key, value)) or not (
        query.shape == key.shape == value.shape
    ):
        raise ValueError("dense_attention takes bfloat16 query, key and value of one shape.")
    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    out = torch.empty_like(query)
    batch, num_tokens, heads, head_size = query.shape
    failed = library.dense_attention_bf16(
        batch, num_tokens, heads, head_size,
        pointer(query), pointer(key), pointer(value), pointer(out), scale,
    )  # fmt: skip
    if failed:
        raise MemoryError("CPU dense attention could not allocate its score buffers.")
    return out


def paged_prefill_attention(
    out: torch.Tensor,  # [num_tokens, H, D] contiguous, written at the requests' query rows
    query: torch.Tensor,  # [num_tokens, H, D], each token's heads dense
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, row] contiguous
    block_tables: torch.Tensor,  # [n, max_blocks] int32 contiguous
    query_starts: torch.Tensor,  # [n] int32: batch token of each request's first query
    query_lens: torch.Tensor,  # [n] int32
    context_lens: torch.Tensor,  # [n] int32: tokens cached before this step
    max_seq_len: int,
    scale: float,
    window: int | None = None,
) -> None:
    """Causal attention of each request's new tokens to its cached context and themselves
    (within `window` positions, when given), read from the paged cache (the new K/V must be
    stored first)."""
    library, dims = _call_setup(query, kv_cache, block_tables, window)
    failed = getattr(library, _PREFILL_FUNCTIONS[(query.dtype, kv_cache.dtype)])(
        ctypes.byref(dims),
        pointer(query),
        _row_stride(query),
        pointer(out),
        pointer(kv_cache),
        pointer(block_tables),
        pointer(query_starts),
        pointer(query_lens),
        pointer(context_lens),
        query_starts.shape[0],
        max_seq_len,
        scale,
    )
    if failed:
        raise MemoryError("CPU prefill attention could not allocate its score buffers.")


def _check_row(kv_cache: torch.Tensor, head_size: int) -> None:
    """The kernels compute row sizes from the head size: a cache of another layout would be
    read or written out of bounds, so it is refused here."""
    want = kv_quant.cache_row_size(head_size) if kv_cache.dtype == torch.int8 else head_size
    if kv_cache.shape[-1] != want or not kv_cache.is_contiguous():
        raise ValueError(
            f"KV cache rows of {kv_cache.shape[-1]} {kv_cache.dtype} elements do not hold "
            f"head size {head_size} (want {want}, contiguous)."
        )


def _row_stride(x: torch.Tensor) -> int:
    """Elements between tokens of a [num_tokens, Hkv, D] tensor whose (Hkv, D) part is dense."""
    assert x.stride(2) == 1 and x.stride(1) == x.shape[2], "each token's heads must be dense"
    return x.stride(0)


def store_int8(
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D + D / 4] int8 contiguous
    key: torch.Tensor,  # [num_tokens, Hkv, D]
    value: torch.Tensor,  # [num_tokens, Hkv, D]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    write_back: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the new tokens' K/V rows into the int8 cache at `slot_mapping`.

    Returns (key, value); with `write_back` they now hold the values the cache gives back
    (written in place, or into contiguous copies when the inputs' heads were not dense).
    """
    library = _library()
    assert library is not None, "call can_store_int8() first"
    _, num_blocks, block_size, num_kv_heads, _ = kv_cache.shape
    _check_row(kv_cache, key.shape[2])
    if key.stride(2) != 1 or key.stride(1) != key.shape[2]:
        key = key.contiguous()
    if value.stride(2) != 1 or value.stride(1) != value.shape[2]:
        value = value.contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    dims = PagedDims(num_blocks, block_size, num_kv_heads, 0, key.shape[2], 0, 0)
    getattr(library, _STORE_FUNCTIONS[key.dtype])(
        ctypes.byref(dims),
        pointer(kv_cache),
        pointer(key),
        pointer(value),
        _row_stride(key),
        _row_stride(value),
        pointer(slots),
        slots.shape[0],
        int(write_back),
    )
    return key, value
