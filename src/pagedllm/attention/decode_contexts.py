"""Dense decode contexts kept from one step to the next (the grouped torch backend's,
torch_grouped.py), and the gather they start from.

In steady decoding the same requests come back every step, each one token longer.
Gathering their whole contexts out of the paged cache again each step costs as much as the
rest of attention; instead the dense copy of the previous step is kept per layer and decode
bucket, and only the new token's K/V is written into it. The paged cache stays the source
of truth: anything that is not exactly the previous step one token later (a request joins
or leaves, preemption, the headroom used up, positions written again by speculative
decoding) gathers afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pagedllm.attention import kv_quant


@dataclass
class KVGather:
    """Where some requests' contexts live in the cache, padded to a common length.

    Attributes:
        slots: [n, max_seq_len] cache slot of each context position; padding reads slot 0
            (in the reserved null block, zero-initialised, so masked reads stay finite).
        max_seq_len: padded context length.
    """

    slots: torch.Tensor
    max_seq_len: int


@dataclass
class DecodeBucket:
    """Decode requests (one query token each) of similar context length.

    Attributes:
        token_indices: [n] their tokens in the batch; None when the bucket is the whole
            batch, in order.
        kv: their contexts.
        key_valid: [n, max_seq_len] bool, position < seq_len.
        seq_lens / block_rows: [n] and [n, max_num_blocks], to recognise the next step.
        is_extension: the same requests as this bucket in the previous step, each one token
            longer: the dense contexts kept from that step are extended, not gathered again.
    """

    token_indices: torch.Tensor | None
    kv: KVGather
    key_valid: torch.Tensor
    seq_lens: torch.Tensor
    block_rows: torch.Tensor
    is_extension: bool = False


class DecodeContexts:
    """Dense decode contexts kept from one step to the next, per layer and decode bucket.

    In steady decoding the same requests come back every step, each one token longer.
    Gathering their whole contexts out of the paged cache again each step costs as much as
    the rest of attention; instead the dense copy of the previous step is kept and only the
    new token's K/V is written into it. A bucket is an extension of the previous step's
    bucket with the same index when it holds the same number of requests with the same
    block tables (new blocks may be appended) and every seq_len grew by exactly one: then
    every cached position is unchanged, since the cache only ever writes positions >=
    seq_len. Anything else (a request joins or leaves, preemption, headroom used up) falls
    back to a fresh gather. The paged cache stays the source of truth.
    """

    def __init__(self) -> None:
        self._previous: list[DecodeBucket] = []
        self._contexts: dict[tuple[int, int], torch.Tensor] = {}

    def start_step(self, buckets: list[DecodeBucket], reuse: bool = True) -> None:
        """Mark which of this step's buckets extend last step's; drop stale contexts.
        With `reuse` False every context is gathered afresh."""
        for i, bucket in enumerate(buckets):
            bucket.is_extension = (
                reuse and i < len(self._previous) and _extends(self._previous[i], bucket)
            )
            if bucket.is_extension:
                # Keep the previous allocation (it still has headroom) and its length.
                bucket.kv = self._previous[i].kv
                positions = torch.arange(bucket.kv.max_seq_len, device=bucket.seq_lens.device)
                bucket.key_valid = positions < bucket.seq_lens.unsqueeze(1)
        if not buckets:
            self._contexts.clear()
        self._previous = buckets

    def get(
        self,
        kv_cache: torch.Tensor,
        bucket: DecodeBucket,
        bucket_id: int,
        key: torch.Tensor,  # [num_tokens, Hkv, D] this step's keys
        value: torch.Tensor,
        derived: dict[tuple[Any, ...], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:  # each [n * Hkv, S, D]
        """The bucket's dense context for this layer: extended in place, or gathered."""
        name = (bucket_id, kv_cache.data_ptr())
        context = self._contexts.get(name)
        if bucket.is_extension and context is not None:
            rows, positions = _append_index(bucket, key.shape[1], derived, bucket_id)
            tokens = bucket.token_indices
            new_k = key if tokens is None else key.index_select(0, tokens)  # [n, Hkv, D]
            new_v = value if tokens is None else value.index_select(0, tokens)
            context[0].index_put_((rows, positions), new_k.reshape(-1, key.shape[-1]))
            context[1].index_put_((rows, positions), new_v.reshape(-1, key.shape[-1]))
        else:
            num_kv_heads = kv_cache.shape[-2]
            index_name = ("decode", bucket_id, num_kv_heads)
            context = gather_kv(kv_cache, bucket.kv, derived, index_name, key.dtype)
            self._contexts[name] = context
        return context[0], context[1]


def _extends(previous: DecodeBucket, bucket: DecodeBucket) -> bool:
    """True when `bucket` is `previous` one token later (see _DecodeContexts)."""
    if previous.seq_lens.shape != bucket.seq_lens.shape:
        return False
    if int(bucket.seq_lens.max()) > previous.kv.max_seq_len:
        return False  # headroom used up
    old_blocks = previous.block_rows.shape[1]
    if bucket.block_rows.shape[1] < old_blocks:
        return False
    if not torch.equal(previous.seq_lens + 1, bucket.seq_lens):
        return False
    # Padding (the null block 0) may since have become a newly appended block.
    old_rows = previous.block_rows
    kept = (bucket.block_rows[:, :old_blocks] == old_rows) | (old_rows == 0)
    return bool(kept.all())


def _append_index(
    bucket: DecodeBucket,
    num_kv_heads: int,
    derived: dict[tuple[Any, ...], torch.Tensor],
    bucket_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, position) in the dense context of each request's new token, per kv head."""
    name = ("append", bucket_id, num_kv_heads)
    if name not in derived:
        rows = torch.arange(bucket.seq_lens.shape[0] * num_kv_heads, device=bucket.seq_lens.device)
        positions = (bucket.seq_lens - 1).repeat_interleave(num_kv_heads)
        derived[name] = torch.stack([rows, positions])
    index = derived[name]
    return index[0], index[1]


def gather_kv(
    kv_cache: torch.Tensor,
    kv: KVGather,
    derived: dict[tuple[Any, ...], torch.Tensor],
    name: tuple[Any, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """Dense copy of some requests' contexts: [2, n * Hkv, max_seq_len, D] in `dtype`,
    heads-major (an int8 cache's rows are dequantized).

    Gathering (slot, kv head) rows makes each head's keys contiguous, as the batched
    matmuls need; a block-level gather copies faster but leaves heads interleaved, and
    de-interleaving them costs another full copy.
    """
    num_kv_heads, row_size = kv_cache.shape[-2:]
    index = derived.get(name)
    if index is None:
        heads = torch.arange(num_kv_heads, device=kv.slots.device).view(1, -1, 1)
        index = (kv.slots.unsqueeze(1) * num_kv_heads + heads).view(-1)  # [n * Hkv * S]
        derived[name] = index
    rows = kv_cache.view(2, -1, row_size)  # [2, num_slots * Hkv, row]
    context = rows.index_select(1, index).view(2, -1, kv.max_seq_len, row_size)
    if kv_cache.dtype == torch.int8:
        return kv_quant.dequantize_rows(context, dtype)
    return context


