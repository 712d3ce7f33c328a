"""Portable paged attention in plain PyTorch: the reference every other backend is checked
against, and the path of what they do not serve (CUDA without Triton, float16 on CPU, no C
compiler).

Per layer it writes the new tokens' K/V into the paged cache (backend.py's shared
preamble), then attends: the step's decodes (one query token each) in one padded batch
over their contexts gathered from the cache, and each prefill (several query tokens after
a possibly cached context) on its own, causally. It is stateless: the step's metadata (the
context slots of every request, computed once) is all it keeps, and nothing survives the
step. The only splits are memory bounds (how many context tokens one gather or one score
matrix holds), never a cost model. The G query heads sharing a kv head are the rows of one
matmul, so grouped-query attention needs no K/V expansion.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedllm.attention import kv_quant
from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata

# Memory bounds: the most context positions one decode gather copies out of the cache, and
# the most (query row x key) scores one prefill chunk holds per attention head.
_MAX_GATHERED_POSITIONS = 1 << 17
_MAX_SCORES_PER_HEAD = 1 << 20


@dataclass
class _Decodes:
    """Decode requests (one query token each), laid out for one padded batch.

    Attributes:
        tokens: [n] batch token of each request.
        slots: [n, S] cache slot of each context position, 0 (the null block) past seq_len.
        seq_lens: [n] context length including the new token.
    """

    tokens: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor


@dataclass
class _Prefill:
    """One request computing several tokens: its tokens in the batch and its context.

    Attributes:
        first_token / num_tokens: its query rows in the batch.
        context_len: tokens cached before this step.
        slots: [context_len + num_tokens] cache slot of every position.
        key_ends: [num_tokens] each query's key bound (exclusive), where some attend past
            themselves (an image's tokens, both ways); None: causal.
    """

    first_token: int
    num_tokens: int
    context_len: int
    slots: torch.Tensor
    key_ends: torch.Tensor | None = None


@dataclass
class TorchPagedMetadata:
    """One step's layout for `TorchPagedBackend`, shared by all layers of the step."""

    num_tokens: int
    slot_mapping: torch.Tensor
    decodes: list[_Decodes] = field(default_factory=list)
    prefills: list[_Prefill] = field(default_factory=list)


def _context_slots(block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """[length] cache slot of each position of a request with this block table row."""
    positions = torch.arange(length, device=block_table.device)
    return block_table[positions // block_size] * block_size + positions % block_size


def _decode_batches(
    common: CommonAttentionMetadata, rows: list[int], block_size: int
) -> list[_Decodes]:
    """The decode rows in batches whose gathered contexts stay within the memory bound."""
    max_seq_len = max(common.seq_lens_cpu[i] for i in rows)
    per_batch = max(1, _MAX_GATHERED_POSITIONS // max_seq_len)
    batches = []
    for start in range(0, len(rows), per_batch):
        index = torch.tensor(rows[start : start + per_batch], device=common.seq_lens.device)
        seq_lens = common.seq_lens[index]  # [n]
        positions = torch.arange(max_seq_len, device=index.device)
        columns = (positions // block_size).clamp_(max=common.block_tables.shape[1] - 1)
        slots = common.block_tables[index][:, columns] * block_size + positions % block_size
        slots.masked_fill_(positions >= seq_lens.unsqueeze(1), 0)  # [n, S]
        batches.append(_Decodes(common.query_start_loc[index], slots, seq_lens))
    return batches


def _prefill(common: CommonAttentionMetadata, row: int, block_size: int) -> _Prefill:
    num_tokens, seq_len = common.query_lens_cpu[row], common.seq_lens_cpu[row]
    first_token = sum(common.query_lens_cpu[:row])
    key_ends = None
    if common.key_ends is not None:
        key_ends = common.key_ends[first_token : first_token + num_tokens]
    return _Prefill(
        first_token=first_token,
        num_tokens=num_tokens,
        context_len=seq_len - num_tokens,
        slots=_context_slots(common.block_tables[row], seq_len, block_size),
        key_ends=key_ends,
    )


def _gather(kv_cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K and V at `slots` [..., S], heads-major: [2, ... * Hkv, S, D] in `dtype` (an int8
    cache's rows dequantized)."""
    num_kv_heads, row_size = kv_cache.shape[-2:]
    heads = torch.arange(num_kv_heads, device=slots.device)
    index = (slots.unsqueeze(-2) * num_kv_heads + heads.unsqueeze(-1)).reshape(-1)
    rows = kv_cache.view(2, -1, row_size).index_select(1, index)
    rows = rows.view(2, -1, slots.shape[-1], row_size)  # [2, ... * Hkv, S, row]
    return kv_quant.dequantize_rows(rows, dtype) if kv_cache.dtype == torch.int8 else rows


def _attend(
    query: torch.Tensor,  # [B, rows, D], the rows of one kv head
    keys: torch.Tensor,  # [B, S, D]
    values: torch.Tensor,  # [B, S, D]
    allowed: torch.Tensor,  # broadcastable to [B, rows, S] bool
    scale: float,
) -> torch.Tensor:  # [B, rows, D]
    """softmax(q k^T * scale, masked) v."""
    mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    mask.masked_fill_(~allowed, float("-inf"))
    scores = torch.baddbmm(mask.expand(*query.shape[:2], keys.shape[1]), query,
                           keys.transpose(1, 2), alpha=scale)
    return torch.bmm(torch.softmax(scores, dim=-1), values)


class TorchPagedBackend(AttentionBackend):
    """Paged attention with plain torch ops; exact up to float rounding, on any device.

    KV cache of one layer: [2, num_blocks, block_size, num_kv_heads, head_size], K then V;
    slot s is (block s // block_size, offset s % block_size). Block 0 is the null block
    that pads block tables; it must hold finite values (the engine zero-initialises it).
    An int8 cache (kv_cache_dtype="int8") has int8 rows of head_size + head_size / 4
    bytes instead: the codes and a float32 scale per 16 of them (kv_quant.py).
    """

    name = "torch"

    # [2 (K, V), num_blocks, block_size, num_kv_heads, row]: values, or int8 rows.
    get_kv_cache_shape = staticmethod(kv_quant.cache_shape)

    def build_metadata(
        self, common: CommonAttentionMetadata, block_size: int
    ) -> TorchPagedMetadata:
        """Every request's context slots, decodes batched, prefills one by one."""
        metadata = TorchPagedMetadata(common.num_tokens, common.slot_mapping)
        decode_rows, prefill_rows = common.decode_and_prefill_rows()
        if decode_rows:
            metadata.decodes = _decode_batches(common, decode_rows, block_size)
        metadata.prefills = [_prefill(common, row, block_size) for row in prefill_rows]
        return metadata

    def store_kv(
        self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As the base, but an int8 cache's new tokens come back in their round-tripped
        form: every token is then attended as the cache holds it, whether it came from
        this step, an earlier chunk or the prefix cache."""
        if kv_cache.dtype != torch.int8:
            return super().store_kv(kv_cache, key, value, slot_mapping)
        rows = kv_quant.store_rows(kv_cache, key, value, slot_mapping)
        new = kv_quant.dequantize_rows(rows, key.dtype)
        return new[0], new[1]

    def attend(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,
        metadata: TorchPagedMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Decodes in padded batches from the cache; each prefill over its context."""
        out = torch.empty_like(query)
        for decodes in metadata.decodes:
            out[decodes.tokens] = _decode_attention(
                query[decodes.tokens], kv_cache, decodes, scale, window
            )
        for prefill in metadata.prefills:
            tokens = slice(prefill.first_token, prefill.first_token + prefill.num_tokens)
            out[tokens] = _prefill_attention(query[tokens], kv_cache, prefill, scale, window)
        return out


def _decode_attention(
    query: torch.Tensor,  # [n, H, D]
    kv_cache: torch.Tensor,
    decodes: _Decodes,
    scale: float,
    window: int | None,
) -> torch.Tensor:  # [n, H, D]
    """One query token per request: a batch of (request, kv head) matmuls."""
    num_reqs, num_heads, head_size = query.shape
    num_kv_heads = kv_cache.shape[-2]
    keys, values = _gather(kv_cache, decodes.slots, query.dtype)  # [n * Hkv, S, D] each
    positions = torch.arange(decodes.slots.shape[1], device=query.device)
    seq_lens = decodes.seq_lens.unsqueeze(1)  # [n, 1]
    allowed = positions < seq_lens  # [n, S]
    if window is not None:
        allowed &= positions >= seq_lens - window
    allowed = allowed.repeat_interleave(num_kv_heads, dim=0).unsqueeze(1)  # [n * Hkv, 1, S]
    grouped = query.reshape(num_reqs * num_kv_heads, -1, head_size)  # [n * Hkv, G, D]
    out = _attend(grouped, keys, values, allowed, scale)
    return out.view(num_reqs, num_heads, head_size)


def _prefill_attention(
    query: torch.Tensor,  # [L, H, D]
    kv_cache: torch.Tensor,
    prefill: _Prefill,
    scale: float,
    window: int | None,
) -> torch.Tensor:  # [L, H, D]
    """A request's new tokens, causally over its context and themselves (an image's tokens
    also to the image's later tokens: `key_ends`), in chunks of query rows within the
    scores' memory bound."""
    num_rows, num_heads, head_size = query.shape
    num_kv_heads = kv_cache.shape[-2]
    group = num_heads // num_kv_heads
    keys, values = _gather(kv_cache, prefill.slots, query.dtype)  # [Hkv, S, D] each
    seq_len = prefill.slots.shape[0]
    # [Hkv, L * G, D]: a kv head's query rows, G heads per query position, scaled once.
    folded = query.view(num_rows, num_kv_heads, group * head_size).transpose(0, 1)
    folded = folded.reshape(num_kv_heads, num_rows * group, head_size) * scale
    key_pos = torch.arange(seq_len, device=query.device)
    out = torch.empty_like(folded)
    chunk = max(1, _MAX_SCORES_PER_HEAD // seq_len)
    for start in range(0, num_rows, chunk):
        end = min(start + chunk, num_rows)
        query_pos = prefill.context_len + torch.arange(start, end, device=query.device)
        if prefill.key_ends is None:
            allowed = key_pos <= query_pos.unsqueeze(1)  # [rows, S]
        else:  # causal, or up to the end of the query's image (both ways within it)
            allowed = key_pos < prefill.key_ends[start:end].unsqueeze(1)
        if window is not None:
            allowed &= key_pos > query_pos.unsqueeze(1) - window
        allowed = allowed.repeat_interleave(group, dim=0).unsqueeze(0)  # [1, rows * G, S]
        rows = slice(start * group, end * group)
        out[:, rows] = _attend(folded[:, rows], keys, values, allowed, 1.0)
    out = out.view(num_kv_heads, num_rows, group, head_size).transpose(0, 1)
    return out.reshape(num_rows, num_heads, head_size)
