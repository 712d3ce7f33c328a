"""Portable paged-attention backend in plain PyTorch: the CPU hot path and the test oracle.

Per layer it writes the new tokens' K/V into the block-structured cache, gathers each
request's context into a padded dense layout and attends with batched matmuls.
Everything that depends only on the batch layout (gather indices, padding, masks) is
computed once per step in `build_metadata` and shared by all layers, so a layer call is a
handful of large tensor ops with no Python loop over requests or tokens. It imports no
CUDA library and never touches cache slots other than the step's `slot_mapping`.

Requests are split into two groups so that neither pays for the other's padding:
decodes (one query token) and prefills (several query tokens, possibly after a cached
context). A batch of one request without context skips the cache read entirely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata

# Score-matrix elements per attention head in one prefill query chunk (x num_heads in all,
# ~4.5M for 9 heads): small enough to stay in cache, large enough for efficient matmuls.
_SCORES_PER_HEAD = 1 << 19


@dataclass
class _KVGather:
    """Where a group of requests' contexts live in the cache, padded to a common length.

    Attributes:
        slots: [n, max_seq_len] cache slot of each context position; padding reads slot 0
            (the reserved null block, zero-initialised, so masked reads stay finite).
        max_seq_len: padded context length of the group.
    """

    slots: torch.Tensor
    max_seq_len: int


@dataclass
class _DecodeGroup:
    """Requests with exactly one query token.

    Attributes:
        token_indices: [n] their tokens in the batch; None when the batch is only decodes.
        kv: their contexts.
        key_valid: [n, max_seq_len] bool, position < seq_len.
    """

    token_indices: torch.Tensor | None
    kv: _KVGather
    key_valid: torch.Tensor


@dataclass
class _PrefillGroup:
    """Requests with several query tokens, laid out as [n, max_query_len] padded queries.

    Attributes:
        query_index: [n * max_query_len] batch token of each padded query row (padding
            repeats the request's last token, so it holds real values).
        valid_rows: [num_prefill_tokens] padded rows that hold real queries, in batch order.
        token_indices: [num_prefill_tokens] their tokens in the batch; None when the batch
            is only prefills (then the valid rows are the batch, in order).
        max_query_len: padded query length.
        kv: their contexts (cached context plus this step's tokens); None for a single
            request without cached context, whose keys are exactly the step's new tokens.
        allowed: [n, max_query_len, max_seq_len] bool: key position <= the query's position
            (causal, shifted by the cached context) and < seq_len.
        chunks: (first row, end row, end key) of each query chunk: chunks bound the size of
            the score matrix, and keys past every row's causal limit are skipped.
    """

    query_index: torch.Tensor
    valid_rows: torch.Tensor
    token_indices: torch.Tensor | None
    max_query_len: int
    kv: _KVGather | None
    allowed: torch.Tensor
    chunks: list[tuple[int, int, int]]


@dataclass
class TorchPagedMetadata:
    """Per-step metadata of `TorchPagedBackend`, shared by all layers of the step.

    Attributes:
        num_tokens: tokens in the batch.
        slot_mapping: [num_tokens] cache slot of each new token.
        decode: the decode group, if any.
        prefill: the prefill group, if any.
        derived: tensors derived on the first layer call because they depend on the
            layers' head count or dtype (head-expanded gather indices, additive masks);
            later layers of the step reuse them.
    """

    num_tokens: int
    slot_mapping: torch.Tensor
    decode: _DecodeGroup | None = None
    prefill: _PrefillGroup | None = None
    derived: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)


def _context_slots(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, block_size: int
) -> _KVGather:
    """Slots of positions [0, max_seq_len) of each request, padding mapped to slot 0."""
    device = block_tables.device
    positions = torch.arange(max_seq_len, device=device)  # [S]
    block_ids = block_tables[:, positions // block_size]  # [n, S]
    slots = block_ids * block_size + positions % block_size  # [n, S]
    slots.masked_fill_(positions >= seq_lens.unsqueeze(1), 0)
    return _KVGather(slots=slots, max_seq_len=max_seq_len)


def _build_decode_group(
    common: CommonAttentionMetadata, rows: torch.Tensor, block_size: int, is_whole_batch: bool
) -> _DecodeGroup:
    seq_lens = common.seq_lens[rows]  # [n]
    max_seq_len = max(common.seq_lens_cpu[i] for i in rows.tolist())
    kv = _context_slots(common.block_tables[rows], seq_lens, max_seq_len, block_size)
    key_valid = torch.arange(max_seq_len, device=seq_lens.device) < seq_lens.unsqueeze(1)
    token_indices = None if is_whole_batch else common.query_start_loc[rows]
    return _DecodeGroup(token_indices=token_indices, kv=kv, key_valid=key_valid)


def _query_chunks(
    max_query_len: int, max_seq_len: int, max_context_len: int, num_reqs: int
) -> list[tuple[int, int, int]]:
    """Split padded query rows into chunks whose per-head scores stay within budget."""
    rows = max(1, _SCORES_PER_HEAD // (num_reqs * max_seq_len))
    return [
        (start, min(start + rows, max_query_len), min(max_seq_len, max_context_len + start + rows))
        for start in range(0, max_query_len, rows)
    ]


def _build_prefill_group(
    common: CommonAttentionMetadata, rows: torch.Tensor, block_size: int, is_whole_batch: bool
) -> _PrefillGroup:
    row_list = rows.tolist()
    max_query_len = max(common.query_lens_cpu[i] for i in row_list)
    max_seq_len = max(common.seq_lens_cpu[i] for i in row_list)
    max_context_len = max(common.seq_lens_cpu[i] - common.query_lens_cpu[i] for i in row_list)
    device = common.query_lens.device
    query_lens = common.query_lens[rows].unsqueeze(1)  # [n, 1]
    seq_lens = common.seq_lens[rows]  # [n]
    offsets = torch.arange(max_query_len, device=device).unsqueeze(0)  # [1, Lq]
    starts = common.query_start_loc[rows].unsqueeze(1)  # [n, 1]
    query_index = (starts + torch.minimum(offsets, query_lens - 1)).view(-1)  # [n * Lq]
    valid_rows = (offsets < query_lens).view(-1).nonzero().squeeze(1)  # [num_prefill_tokens]
    query_pos = (common.context_lens[rows].unsqueeze(1) + offsets).unsqueeze(2)  # [n, Lq, 1]
    key_pos = torch.arange(max_seq_len, device=device).view(1, 1, -1)  # [1, 1, S]
    allowed = (key_pos <= query_pos) & (key_pos < seq_lens.view(-1, 1, 1))  # [n, Lq, S]
    # A lone request without context attends only to its own new tokens: no cache read.
    kv = None
    if len(row_list) > 1 or max_context_len > 0:
        kv = _context_slots(common.block_tables[rows], seq_lens, max_seq_len, block_size)
    return _PrefillGroup(
        query_index=query_index,
        valid_rows=valid_rows,
        token_indices=None if is_whole_batch else query_index[valid_rows],
        max_query_len=max_query_len,
        kv=kv,
        allowed=allowed,
        chunks=_query_chunks(max_query_len, max_seq_len, max_context_len, len(row_list)),
    )


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool "may attend" → 0 / -inf in `dtype`, to be added to the scores."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, float("-inf"))


class TorchPagedBackend(AttentionBackend):
    """Paged attention with plain torch ops; exact (up to float rounding) on any device.

    KV cache of one layer: [2, num_blocks, block_size, num_kv_heads, head_size], K then V;
    slot s is (block s // block_size, offset s % block_size).
    """

    name = "torch"

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """[2 (K, V), num_blocks, block_size, num_kv_heads, head_size]."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    def build_metadata(
        self, common: CommonAttentionMetadata, block_size: int
    ) -> TorchPagedMetadata:
        """Split the batch into decode and prefill groups and precompute their layouts."""
        metadata = TorchPagedMetadata(
            num_tokens=common.num_tokens, slot_mapping=common.slot_mapping
        )
        query_lens = common.query_lens_cpu
        is_decode = common.query_lens == 1  # [num_reqs]
        num_decodes = sum(1 for n in query_lens if n == 1)
        if num_decodes > 0:
            rows = is_decode.nonzero().squeeze(1)
            is_whole = num_decodes == common.num_reqs
            metadata.decode = _build_decode_group(common, rows, block_size, is_whole)
        if num_decodes < common.num_reqs:
            rows = (~is_decode).nonzero().squeeze(1)
            is_whole = num_decodes == 0
            metadata.prefill = _build_prefill_group(common, rows, block_size, is_whole)
        return metadata

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_size]
        metadata: TorchPagedMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Store the new K/V at `slot_mapping`, then attend each query to its context."""
        num_kv_heads, head_size = kv_cache.shape[-2:]
        flat_cache = kv_cache.view(2, -1, num_kv_heads, head_size)  # [2, num_slots, Hkv, D]
        flat_cache[0].index_copy_(0, metadata.slot_mapping, key)
        flat_cache[1].index_copy_(0, metadata.slot_mapping, value)
        decode, prefill = metadata.decode, metadata.prefill
        if prefill is None:
            assert decode is not None
            return _decode_attention(query, kv_cache, decode, metadata.derived, scale)
        prefill_out = _prefill_attention(
            query, key, value, kv_cache, prefill, metadata.derived, scale
        )
        if decode is None:
            return prefill_out
        out = torch.empty_like(query)  # [num_tokens, H, D]
        assert decode.token_indices is not None and prefill.token_indices is not None
        decode_query = query.index_select(0, decode.token_indices)  # [num_decodes, H, D]
        decode_out = _decode_attention(decode_query, kv_cache, decode, metadata.derived, scale)
        out.index_copy_(0, decode.token_indices, decode_out)
        out.index_copy_(0, prefill.token_indices, prefill_out)
        return out


def _gather_kv(
    kv_cache: torch.Tensor,
    kv: _KVGather,
    derived: dict[tuple[Any, ...], torch.Tensor],
    group_name: str,
) -> torch.Tensor:
    """Dense copy of a group's contexts: [2, n * Hkv, max_seq_len, D], heads-major.

    Gathering rows of one (slot, kv head) at a time makes each head's keys contiguous,
    which is what the batched matmuls below need; a block-level gather would be a faster
    copy but leave heads interleaved and force another copy.
    """
    _, _, _, num_kv_heads, head_size = kv_cache.shape
    key = (group_name, "gather", num_kv_heads)
    index = derived.get(key)
    if index is None:
        heads = torch.arange(num_kv_heads, device=kv.slots.device).view(1, -1, 1)
        index = (kv.slots.unsqueeze(1) * num_kv_heads + heads).view(-1)  # [n * Hkv * S]
        derived[key] = index
    rows = kv_cache.view(2, -1, head_size)  # [2, num_slots * Hkv, D]
    gathered = rows.index_select(1, index)  # [2, n * Hkv * S, D]
    return gathered.view(2, -1, kv.max_seq_len, head_size)


def _decode_attention(
    query: torch.Tensor,  # [n, H, D]
    kv_cache: torch.Tensor,
    group: _DecodeGroup,
    derived: dict[tuple[Any, ...], torch.Tensor],
    scale: float,
) -> torch.Tensor:  # [n, H, D]
    """One query token per request: batched matmuls over (request, kv head).

    The G = H / Hkv query heads sharing a kv head become G rows of one matmul, so GQA
    costs no K/V expansion. Plain bmm beats SDPA here: its CPU kernel is tuned for long
    queries and spends most of its time on setup for a single row.
    """
    num_reqs, num_heads, head_size = query.shape
    num_kv_heads = kv_cache.shape[-2]
    kv = _gather_kv(kv_cache, group.kv, derived, "decode")  # [2, n * Hkv, S, D]
    mask_key = ("decode_mask", num_kv_heads, query.dtype)
    mask = derived.get(mask_key)
    if mask is None:
        mask = _additive_mask(group.key_valid, query.dtype)  # [n, S]
        mask = mask.repeat_interleave(num_kv_heads, dim=0).unsqueeze(1)  # [n * Hkv, 1, S]
        derived[mask_key] = mask
    grouped_query = query.reshape(num_reqs * num_kv_heads, -1, head_size)  # [n*Hkv, G, D]
    scores = torch.baddbmm(mask, grouped_query, kv[0].transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, dim=-1)  # [n * Hkv, G, S]
    out = torch.bmm(probs, kv[1])  # [n * Hkv, G, D]
    return out.view(num_reqs, num_heads, head_size)


def _prefill_attention(
    query: torch.Tensor,  # [num_tokens, H, D]
    key: torch.Tensor,  # [num_tokens, Hkv, D]
    value: torch.Tensor,  # [num_tokens, Hkv, D]
    kv_cache: torch.Tensor,
    group: _PrefillGroup,
    derived: dict[tuple[Any, ...], torch.Tensor],
    scale: float,
) -> torch.Tensor:  # [num_prefill_tokens, H, D]
    """Several query tokens per request: batched matmuls over padded queries, by chunks.

    Explicit matmul + softmax runs several times faster than the CPU SDPA kernel for
    these shapes. As for decodes, the G = H / Hkv query heads of a kv head are folded into
    the rows of one matmul, so GQA needs no K/V expansion.
    """
    _, num_heads, head_size = query.shape
    num_kv_heads = key.shape[1]
    group_size = num_heads // num_kv_heads
    num_reqs, max_query_len = group.allowed.shape[:2]
    if group.kv is None:  # one request, no context: its keys are the new tokens, in order
        keys = key.transpose(0, 1).contiguous()  # [Hkv, S, D]
        values = value.transpose(0, 1).contiguous()
    else:
        keys, values = _gather_kv(kv_cache, group.kv, derived, "prefill")  # [n * Hkv, S, D]
    mask_key = ("prefill_mask", query.dtype)
    mask = derived.get(mask_key)
    if mask is None:
        mask = _additive_mask(group.allowed, query.dtype).unsqueeze(1).unsqueeze(3)
        derived[mask_key] = mask  # [n, 1, Lq, 1, S], broadcast over kv heads and G
    padded = query.index_select(0, group.query_index)  # [n * Lq, H, D]
    folded = padded.view(num_reqs, max_query_len, num_kv_heads, group_size * head_size)
    folded = folded.transpose(1, 2).contiguous().mul_(scale)  # [n, Hkv, Lq, G * D]
    folded = folded.view(num_reqs * num_kv_heads, max_query_len * group_size, head_size)
    out = torch.empty_like(folded)  # [n * Hkv, Lq * G, D]; rows are (query, head in group)
    for start, end, key_end in group.chunks:
        rows = slice(start * group_size, end * group_size)
        scores = torch.bmm(folded[:, rows], keys[:, :key_end].transpose(1, 2))
        scores.view(num_reqs, num_kv_heads, end - start, group_size, key_end).add_(
            mask[:, :, start:end, :, :key_end]
        )  # scores: [n * Hkv, (end - start) * G, key_end]
        out[:, rows] = torch.bmm(torch.softmax(scores, dim=-1), values[:, :key_end])
    out = out.view(num_reqs, num_kv_heads, max_query_len, num_heads // num_kv_heads, head_size)
    out = out.transpose(1, 2).reshape(num_reqs * max_query_len, num_heads, head_size)
    return out.index_select(0, group.valid_rows)  # [num_prefill_tokens, H, D]
