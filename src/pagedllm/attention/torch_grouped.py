"""Paged attention in plain PyTorch, made fast: the path where neither the C kernels nor
Triton serve (no C compiler, float16 on CPU, CUDA without Triton). The platform picks it
there; `torch_paged.py` stays the simple reference both are checked against.

Per layer it writes the new tokens' K/V into the block-structured cache, gathers each
request's context into a padded dense layout and attends with batched matmuls. Everything
that depends only on the batch layout (gather indices, padding, masks, chunking) is computed
once per step in `build_metadata` and shared by all layers, so a layer call is a handful of
large tensor ops with no Python loop over requests or tokens. It imports no CUDA library
and never writes cache slots other than the step's `slot_mapping`.

Two things make it fast, and are its whole difference from the reference:
- requests are grouped so that none pays much for another's padding: decodes (one query
  token) and prefills (several query tokens, possibly after a cached context) go into
  separate groups of similar lengths (a small cost model picks how many), each attended by
  one batch of padded tensor ops; a prefill group of one request without context attends to
  its own new K/V without reading the cache back;
- in steady decoding the dense contexts of the previous step are kept and extended by one
  token instead of gathered again (decode_contexts.py).

Why not `scaled_dot_product_attention`: on CPU its kernel is several times slower than
matmul + softmax + matmul at these shapes (one query row per decode; head_dim 64 prefills).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pagedllm.attention.backend import CommonAttentionMetadata
from pagedllm.attention.decode_contexts import DecodeBucket, DecodeContexts, KVGather, gather_kv
from pagedllm.attention.torch_paged import TorchPagedBackend

# Score elements per attention head in one prefill query chunk (x num_heads in all, ~2.4M
# for 9 heads): keeps the scores in cache between the matmuls and the softmax. Very long
# contexts still get at least _MIN_CHUNK_ROWS query rows, or the matmuls get too thin.
_SCORES_PER_HEAD = 1 << 17
_MIN_CHUNK_ROWS = 64
# Fixed cost of one more group of requests, in (query, key) pairs of padded work: decodes
# are memory-bound (each key is gathered for one query), prefills compute-bound.
_DECODE_GROUP_COST = 1024
_PREFILL_GROUP_COST = 16384
# Most context tokens one decode group gathers at once (~100 MB of bf16 K/V for 3 kv heads
# of size 64): bounds the transient copy when many long requests decode together.
_MAX_DECODE_GATHER_TOKENS = 1 << 17
# Extra context positions allocated in a kept decode context (see _DecodeContexts).
_DECODE_HEADROOM = 32


@dataclass
class _QueryChunk:
    """A range of padded query rows of the prefill group, attended in one go.

    Chunks bound the size of the score matrix. Keys before `mask_start` are visible to
    every row of the chunk and keys from `key_end` on to none, so scores are computed up to
    `key_end` and the mask is only stored and applied in between.

    Attributes:
        start, end: the rows [start, end) of the padded query layout.
        mask_start, key_end: the masked key range.
        allowed: [n, end - start, key_end - mask_start] bool: key position <= the query's
            position (causal, shifted by the cached context) and < seq_len.
        query_pos / seq_lens: [n, end - start, 1] and [n, 1, 1], to build the mask of a
            sliding-window layer, which hides keys before mask_start too.
    """

    start: int
    end: int
    mask_start: int
    key_end: int
    allowed: torch.Tensor
    query_pos: torch.Tensor
    seq_lens: torch.Tensor

    def window_allowed(self, window: int) -> torch.Tensor:
        """[n, rows, key_end] bool: causal, < seq_len and within `window` of the query
        (keys at positions > query - window, as HF's sliding-window masks)."""
        key_pos = torch.arange(self.key_end, device=self.query_pos.device).view(1, 1, -1)
        return (
            (key_pos <= self.query_pos)
            & (key_pos < self.seq_lens)
            & (key_pos > self.query_pos - window)
        )


@dataclass
class _PrefillGroup:
    """Requests with several query tokens, laid out as [n, max_query_len] padded queries.

    Attributes:
        num_reqs: requests in the group.
        query_index: [n * max_query_len] batch token of each padded query row (padding
            repeats the request's last token, so it holds real values).
        valid_rows: [num_prefill_tokens] padded rows that hold real queries, in batch order.
        token_indices: [num_prefill_tokens] their tokens in the batch; None when the batch
            is only prefills (then the valid rows are the batch, in order).
        max_query_len: padded query length.
        kv: their contexts (cached context plus this step's tokens); None for a single
            request without context, whose keys are exactly its new tokens in the batch,
            from `first_token` on.
        first_token: batch position of the group's first token.
        chunks: the query chunks, in order.
    """

    num_reqs: int
    query_index: torch.Tensor
    valid_rows: torch.Tensor
    token_indices: torch.Tensor | None
    max_query_len: int
    kv: KVGather | None
    first_token: int
    chunks: list[_QueryChunk]


@dataclass
class TorchGroupedMetadata:
    """Per-step metadata of `TorchGroupedBackend`, shared by all layers of the step.

    Attributes:
        num_tokens: tokens in the batch.
        slot_mapping: [num_tokens] cache slot of each new token.
        decode_buckets: the decode requests, grouped by context length.
        prefill_groups: the prefill requests, grouped by length.
        derived: tensors derived on the first layer call because they depend on the
            layers' kv head count or dtype (head-expanded gather indices, additive masks);
            later layers of the step reuse them.
    """

    num_tokens: int
    slot_mapping: torch.Tensor
    decode_buckets: list[DecodeBucket] = field(default_factory=list)
    prefill_groups: list[_PrefillGroup] = field(default_factory=list)
    derived: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)


def _context_slots(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, block_size: int
) -> KVGather:
    """Slots of positions [0, max_seq_len) of each request, padding mapped to slot 0."""
    positions = torch.arange(max_seq_len, device=block_tables.device)  # [S]
    # Positions past a block table's width (decode headroom) are padding: any column works.
    columns = (positions // block_size).clamp_(max=block_tables.shape[1] - 1)
    block_ids = block_tables[:, columns]  # [n, S]
    slots = block_ids * block_size + positions % block_size  # [n, S]
    slots.masked_fill_(positions >= seq_lens.unsqueeze(1), 0)
    return KVGather(slots=slots, max_seq_len=max_seq_len)


def _group_by_length(
    rows: list[int], query_lens: list[int], seq_lens: list[int], group_cost: int
) -> list[list[int]]:
    """Groups of rows of similar seq_len, minimising padded query x key work + group costs.

    Candidates are equal-count splits of the rows sorted by seq_len into 1, 2, 4, ...
    groups: cheap to evaluate for hundreds of requests, and close to the optimum when
    lengths vary smoothly. A single group keeps the batch order.
    """

    def cost(group: list[int]) -> int:
        max_query_len = max(query_lens[i] for i in group)
        return len(group) * max_query_len * max(seq_lens[i] for i in group) + group_cost

    ordered = sorted(rows, key=seq_lens.__getitem__)
    best, best_cost = [rows], cost(rows)
    num_groups = 2
    while num_groups <= min(len(rows), 16):
        bounds = [len(rows) * i // num_groups for i in range(num_groups + 1)]
        groups = [ordered[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False)]
        total = sum(cost(group) for group in groups)
        if total < best_cost:
            best, best_cost = groups, total
        num_groups *= 2
    return best


def _build_decode_buckets(
    common: CommonAttentionMetadata, rows: list[int], block_size: int
) -> list[DecodeBucket]:
    """Group the decode requests `rows` by context length and lay out each group."""
    row_groups = []
    for group in _group_by_length(
        rows, common.query_lens_cpu, common.seq_lens_cpu, _DECODE_GROUP_COST
    ):
        max_seq_len = max(common.seq_lens_cpu[i] for i in group)
        size = max(1, _MAX_DECODE_GATHER_TOKENS // max_seq_len)
        row_groups += [group[lo : lo + size] for lo in range(0, len(group), size)]
    buckets = []
    for bucket_rows in row_groups:
        index = torch.tensor(bucket_rows, device=common.seq_lens.device)
        seq_lens = common.seq_lens[index]  # [n]
        # Headroom lets the kept dense context grow for a few steps before a new gather.
        max_seq_len = max(common.seq_lens_cpu[i] for i in bucket_rows) + _DECODE_HEADROOM
        is_whole_batch = len(bucket_rows) == common.num_reqs
        block_rows = common.block_tables[index]
        buckets.append(
            DecodeBucket(
                token_indices=None if is_whole_batch else common.query_start_loc[index],
                kv=_context_slots(block_rows, seq_lens, max_seq_len, block_size),
                key_valid=torch.arange(max_seq_len, device=index.device) < seq_lens.unsqueeze(1),
                seq_lens=seq_lens,
                block_rows=block_rows,
            )
        )
    return buckets


def _query_chunks(
    common: CommonAttentionMetadata, rows: list[int], index: torch.Tensor, max_query_len: int
) -> list[_QueryChunk]:
    """Chunks of padded query rows, with the visibility mask of their masked key range."""
    seq_lens = [common.seq_lens_cpu[i] for i in rows]
    context_lens = [s - common.query_lens_cpu[i] for s, i in zip(seq_lens, rows, strict=True)]
    max_seq_len = max(seq_lens)
    rows_per_chunk = max(_MIN_CHUNK_ROWS, _SCORES_PER_HEAD // (len(rows) * max_seq_len))
    seq_len_col = common.seq_lens[index].view(-1, 1, 1)  # [n, 1, 1]
    context_col = common.context_lens[index].view(-1, 1, 1)  # [n, 1, 1]
    chunks = []
    for start in range(0, max_query_len, rows_per_chunk):
        end = min(start + rows_per_chunk, max_query_len)
        # Row `start` of every request sees keys <= its context + start, below its seq_len.
        mask_start = min(min(c + start + 1, s) for c, s in zip(context_lens, seq_lens, strict=True))
        key_end = min(max_seq_len, max(context_lens) + end)
        query_pos = context_col + torch.arange(start, end, device=index.device).view(1, -1, 1)
        key_pos = torch.arange(mask_start, key_end, device=index.device).view(1, 1, -1)
        allowed = (key_pos <= query_pos) & (key_pos < seq_len_col)  # [n, rows, keys]
        chunks.append(
            _QueryChunk(start, end, mask_start, key_end, allowed, query_pos, seq_len_col)
        )
    return chunks


def _build_prefill_group(
    common: CommonAttentionMetadata, rows: list[int], block_size: int
) -> _PrefillGroup:
    """Padded query layout, context gather and query chunks of the prefill requests `rows`."""
    max_query_len = max(common.query_lens_cpu[i] for i in rows)
    max_seq_len = max(common.seq_lens_cpu[i] for i in rows)
    index = torch.tensor(rows, device=common.query_lens.device)
    query_lens = common.query_lens[index].unsqueeze(1)  # [n, 1]
    offsets = torch.arange(max_query_len, device=index.device).unsqueeze(0)  # [1, Lq]
    starts = common.query_start_loc[index].unsqueeze(1)  # [n, 1]
    query_index = (starts + torch.minimum(offsets, query_lens - 1)).view(-1)  # [n * Lq]
    valid_rows = (offsets < query_lens).view(-1).nonzero().squeeze(1)  # [num_prefill_tokens]
    kv = None
    if len(rows) > 1 or max_seq_len > max_query_len:
        seq_lens = common.seq_lens[index]
        kv = _context_slots(common.block_tables[index], seq_lens, max_seq_len, block_size)
    return _PrefillGroup(
        num_reqs=len(rows),
        query_index=query_index,
        valid_rows=valid_rows,
        token_indices=None if len(rows) == common.num_reqs else query_index[valid_rows],
        max_query_len=max_query_len,
        kv=kv,
        first_token=sum(common.query_lens_cpu[: rows[0]]),
        chunks=_query_chunks(common, rows, index, max_query_len),
    )


class TorchGroupedBackend(TorchPagedBackend):
    """Paged attention with plain torch ops, grouped by length, decode contexts kept;
    exact up to float rounding, on any device. The KV cache layout is the reference's
    (TorchPagedBackend), and so are the K/V writes."""

    name = "torch_grouped"

    def __init__(self) -> None:
        self.decode_contexts = DecodeContexts()

    def build_metadata(  # type: ignore[override]
        self, common: CommonAttentionMetadata, block_size: int
    ) -> TorchGroupedMetadata:
        """Group the decodes and the prefills by length; precompute each group's layout."""
        metadata = TorchGroupedMetadata(
            num_tokens=common.num_tokens, slot_mapping=common.slot_mapping
        )
        decode_rows, prefill_rows = common.decode_and_prefill_rows()
        if decode_rows:
            metadata.decode_buckets = _build_decode_buckets(common, decode_rows, block_size)
        self.decode_contexts.start_step(
            metadata.decode_buckets, reuse=not common.contexts_rewritten
        )
        if prefill_rows:
            groups = _group_by_length(
                prefill_rows, common.query_lens_cpu, common.seq_lens_cpu, _PREFILL_GROUP_COST
            )
            metadata.prefill_groups = [
                _build_prefill_group(common, rows, block_size) for rows in groups
            ]
        return metadata

    def attend(  # type: ignore[override]
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size], stored (round-tripped)
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_size]
        metadata: TorchGroupedMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Attend each query to its context (its last `window` positions only, for a
        sliding-window layer); the store is the reference's (an int8 cache's new tokens
        come back round-tripped)."""
        derived = metadata.derived
        buckets, groups = metadata.decode_buckets, metadata.prefill_groups
        # One group covering the whole batch (in order) needs no scatter.
        if len(groups) == 1 and groups[0].token_indices is None:
            return _prefill_attention(
                query, key, value, kv_cache, groups[0], derived, 0, scale, window
            )
        contexts = self.decode_contexts
        if len(buckets) == 1 and buckets[0].token_indices is None:
            keys, values = contexts.get(kv_cache, buckets[0], 0, key, value, derived)
            return _decode_attention(query, keys, values, buckets[0], derived, 0, scale, window)
        out = torch.empty_like(query)  # [num_tokens, H, D]
        # A loop over a few length groups, not over requests: each is one batch of big ops.
        for i, bucket in enumerate(buckets):
            assert bucket.token_indices is not None
            bucket_query = query.index_select(0, bucket.token_indices)  # [n, H, D]
            keys, values = contexts.get(kv_cache, bucket, i, key, value, derived)
            bucket_out = _decode_attention(
                bucket_query, keys, values, bucket, derived, i, scale, window
            )
            out.index_copy_(0, bucket.token_indices, bucket_out)
        for i, group in enumerate(groups):
            assert group.token_indices is not None
            group_out = _prefill_attention(
                query, key, value, kv_cache, group, derived, i, scale, window
            )
            out.index_copy_(0, group.token_indices, group_out)
        return out


def _decode_attention(
    query: torch.Tensor,  # [n, H, D]
    keys: torch.Tensor,  # [n * Hkv, S, D]
    values: torch.Tensor,  # [n * Hkv, S, D]
    bucket: DecodeBucket,
    derived: dict[tuple[Any, ...], torch.Tensor],
    bucket_id: int,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [n, H, D]
    """One query token per request: batched matmuls over (request, kv head).

    The G = H / Hkv query heads sharing a kv head are the G rows of one matmul, so GQA
    needs no K/V expansion. A `window` hides the keys before the last `window` positions.
    """
    num_reqs, num_heads, head_size = query.shape
    num_kv_heads = keys.shape[0] // num_reqs
    mask_name = ("decode_mask", bucket_id, num_kv_heads, query.dtype, window)
    mask = derived.get(mask_name)
    if mask is None:
        allowed = bucket.key_valid  # [n, S]
        if window is not None:
            positions = torch.arange(allowed.shape[1], device=allowed.device)
            allowed = allowed & (positions >= bucket.seq_lens.unsqueeze(1) - window)
        mask = _additive_mask(allowed, query.dtype)  # [n, S]
        mask = mask.repeat_interleave(num_kv_heads, dim=0).unsqueeze(1)  # [n * Hkv, 1, S]
        derived[mask_name] = mask
    grouped = query.reshape(num_reqs * num_kv_heads, -1, head_size)  # [n * Hkv, G, D]
    scores = torch.baddbmm(mask, grouped, keys.transpose(1, 2), alpha=scale)  # [n*Hkv, G, S]
    out = torch.bmm(torch.softmax(scores, dim=-1), values)  # [n * Hkv, G, D]
    return out.view(num_reqs, num_heads, head_size)


def _prefill_attention(
    query: torch.Tensor,  # [num_tokens, H, D]
    key: torch.Tensor,  # [num_tokens, Hkv, D]
    value: torch.Tensor,  # [num_tokens, Hkv, D]
    kv_cache: torch.Tensor,
    group: _PrefillGroup,
    derived: dict[tuple[Any, ...], torch.Tensor],
    group_id: int,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [num_group_tokens, H, D]
    """Several query tokens per request: batched matmuls over padded queries, by chunks.

    As for decodes, the G query heads of a kv head are folded into the rows of one matmul
    (rows ordered (query, head in group)), so GQA needs no K/V expansion.
    """
    _, num_heads, head_size = query.shape
    num_kv_heads = key.shape[1]
    group_size = num_heads // num_kv_heads
    num_reqs, max_query_len = group.num_reqs, group.max_query_len
    if group.kv is None:  # one request, no context: its keys are its new tokens, in order
        tokens = slice(group.first_token, group.first_token + max_query_len)
        keys = key[tokens].transpose(0, 1).contiguous()  # [Hkv, S, D]
        values = value[tokens].transpose(0, 1).contiguous()
    else:
        gather_name = ("prefill", group_id, num_kv_heads)
        keys, values = gather_kv(kv_cache, group.kv, derived, gather_name, query.dtype)
    padded = query.index_select(0, group.query_index)  # [n * Lq, H, D]
    folded = padded.view(num_reqs, max_query_len, num_kv_heads, group_size * head_size)
    folded = folded.transpose(1, 2).contiguous().mul_(scale)  # [n, Hkv, Lq, G * D]
    folded = folded.view(num_reqs * num_kv_heads, max_query_len * group_size, head_size)
    out = torch.empty_like(folded)  # [n * Hkv, Lq * G, D]
    for i, chunk in enumerate(group.chunks):
        # A window also hides keys before mask_start: its mask covers every key.
        mask_start = chunk.mask_start if window is None else 0
        mask_name = ("prefill_mask", group_id, i, query.dtype, window)
        mask = derived.get(mask_name)
        if mask is None:
            allowed = chunk.allowed if window is None else chunk.window_allowed(window)
            mask = _additive_mask(allowed, query.dtype)[:, None, :, None, :]
            derived[mask_name] = mask  # [n, 1, rows, 1, keys]
        rows = slice(chunk.start * group_size, chunk.end * group_size)
        scores = torch.bmm(folded[:, rows], keys[:, : chunk.key_end].transpose(1, 2))
        num_rows = chunk.end - chunk.start
        scores.view(num_reqs, num_kv_heads, num_rows, group_size, chunk.key_end)[
            ..., mask_start :
        ].add_(mask)  # scores: [n * Hkv, rows * G, key_end]
        out[:, rows] = torch.bmm(torch.softmax(scores, dim=-1), values[:, : chunk.key_end])
    out = out.view(num_reqs, num_kv_heads, max_query_len, group_size, head_size)
    out = out.transpose(1, 2).reshape(num_reqs * max_query_len, num_heads, head_size)
    return out.index_select(0, group.valid_rows)


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool "may attend" → 0 / -inf in `dtype`, to be added to the scores."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, float("-inf"))
