"""Paged attention in Triton: one kernel for prefills (with cached prefixes) and decodes.

The KV cache is the engine's layout, [2, num_blocks, block_size, num_kv_heads, head_size]
(K then V); a request's key at position p lives in block `block_table[p // block_size]`,
row `p % block_size`. Each program attends one tile of one request's query tokens for the
query heads that share one kv head (GQA): their rows are stacked into one [BLOCK_M, D]
tile, so each K/V tile read from the cache serves all of them, and a decode (one query
token) still fills the tensor cores' 16 rows when the group is large. Keys are visited in
tiles of BLOCK_N positions with an online softmax (FlashAttention-2's recurrence), up to
the tile's causal bound (the cached context plus the tile's own tokens), from the sliding
window's start for a windowed layer.

A decode batch too small to fill the GPU (one request on 3 kv heads is 3 programs) splits
each request's keys over several programs (flash-decoding): each writes its share's
unnormalised sums with their maximum and normaliser, and `split_reduce` combines them.

The grid depends only on the number of requests, the longest query and the kv heads:
a decode batch of a fixed size always launches the same grid, so it can be replayed from a
CUDA graph with new sequence lengths and block tables in the same buffers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedllm.triton_kernels.runtime import jit_kernel, round_bf16_in_software, upcast_dot

# Query rows per program for prefills (query tokens x the heads of one kv head) and keys
# per inner step.
_PREFILL_ROWS = 64
_KEY_TILE = 32
_MIN_DOT = 16  # tl.dot needs every dimension >= 16
# Split decoding: programs a decode launch should have at least, and most shares per request.
_DECODE_PROGRAMS = 128
_MAX_SPLITS = 16


def _paged_attention(
    out_ptr, q_ptr, key_cache_ptr, value_cache_ptr, key_scale_ptr, value_scale_ptr,
    block_tables_ptr, seq_lens_ptr,
    query_start_loc_ptr, partial_ptr, stats_ptr, scale, window,
    stride_q_token, stride_q_head, stride_o_token, stride_o_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table,
    QUERIES_PER_KV: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr, FLOAT32_Q: tl.constexpr, ROUND_BF16: tl.constexpr,
    ROUND_P: tl.constexpr,
    NUM_SPLITS: tl.constexpr, INT8_CACHE: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(2)
    if NUM_SPLITS > 1:  # decode: axis 1 is the share of the keys
        split = tl.program_id(1)
        q_tile = 0
    else:
        split = 0
        q_tile = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    token = q_tile * BLOCK_Q + rows // QUERIES_PER_KV  # within the request
    head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_valid = (rows < BLOCK_Q * QUERIES_PER_KV) & (token < q_len)
    q_pos = context_len + token
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_SIZE
    q_offsets = (q_start + token)[:, None] * stride_q_token + head[:, None] * stride_q_head
    q = tl.load(
        q_ptr + q_offsets + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :], other=0.0,
    )
    if FLOAT32_Q:  # the interpreter's 16-bit dot; or keys read from an int8 cache
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    # Keys past the tile's last query are masked for every row: stop there.
    key_end = tl.minimum(seq_len, context_len + (q_tile + 1) * BLOCK_Q)
    key_start = 0
    if USE_WINDOW:
        first_visible = context_len + q_tile * BLOCK_Q - window + 1
        key_start = tl.maximum(first_visible, 0) // BLOCK_N * BLOCK_N
    if NUM_SPLITS > 1:  # this program's share: whole key tiles, as even as they come
        tiles_per_split = tl.cdiv(tl.cdiv(key_end - key_start, BLOCK_N), NUM_SPLITS)
        key_start = key_start + split * tiles_per_split * BLOCK_N
        key_end = tl.minimum(key_end, key_start + tiles_per_split * BLOCK_N)
    table_row = block_tables_ptr + req * stride_table
    for n0 in range(key_start, key_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_valid = pos < key_end
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_valid, other=0)
        kv_offsets = (
            block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_row
            + kv_head * stride_cache_head
        )
        load_mask = pos_valid[None, :] & dim_valid[:, None]
        k = tl.load(key_cache_ptr + kv_offsets[None, :] + dims[:, None], mask=load_mask,
                    other=0.0)  # [HEAD_PAD, BLOCK_N]
        if INT8_CACHE:  # codes times their group's scale (kv_quant.py's row format)
            scale_offsets = kv_offsets // 4 + HEAD_SIZE // 4  # in float32 units
            k_scale = tl.load(key_scale_ptr + scale_offsets[None, :] + (dims // 16)[:, None],
                              mask=load_mask, other=0.0)
            k = k.to(tl.float32) * k_scale
        elif UPCAST_DOT:
            k = k.to(tl.float32)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale
        allowed = (pos[None, :] <= q_pos[:, None]) & pos_valid[None, :]
        if USE_WINDOW:
            allowed = allowed & (pos[None, :] > q_pos[:, None] - window)
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # A row with no visible key yet keeps m = -inf: shift by 0 so exp gives 0, not nan.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(scores - shift[:, None])
        alpha = tl.exp(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(value_cache_ptr + kv_offsets[:, None] + dims[None, :],
                    mask=pos_valid[:, None] & dim_valid[None, :], other=0.0)  # [BLOCK_N, D]
        if INT8_CACHE:
            v_scale = tl.load(
                value_scale_ptr + (kv_offsets // 4 + HEAD_SIZE // 4)[:, None]
                + (dims // 16)[None, :], mask=pos_valid[:, None] & dim_valid[None, :],
                other=0.0,
            )
            v = v.to(tl.float32) * v_scale
        if ROUND_P:  # the interpreter's cast truncates: round to nearest even first
            p_bits = p.to(tl.uint32, bitcast=True)
            p_bits += 0x7FFF + ((p_bits >> 16) & 1)
            p = p_bits.to(tl.float32, bitcast=True)
        p = p.to(v.dtype)
        if UPCAST_DOT:
            p, v = p.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new
    if NUM_SPLITS > 1:
        # Unnormalised share: [token, head, split, dims] sums, [2, token, head, split] max
        # and normaliser; split_reduce() combines the shares.
        row_id = ((q_start + token) * (QUERIES_PER_KV * tl.num_programs(2)) + head) * NUM_SPLITS
        row_id = row_id + split
        tl.store(partial_ptr + row_id[:, None] * HEAD_PAD + dims[None, :], acc,
                 mask=row_valid[:, None])
        stats_rows = tl.num_programs(0) * QUERIES_PER_KV * tl.num_programs(2) * NUM_SPLITS
        tl.store(stats_ptr + row_id, m_i, mask=row_valid)
        tl.store(stats_ptr + stats_rows + row_id, l_i, mask=row_valid)
        return
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if ROUND_BF16:
        acc_bits = acc.to(tl.uint32, bitcast=True)
        acc_bits += 0x7FFF + ((acc_bits >> 16) & 1)
        acc = acc_bits.to(tl.float32, bitcast=True)
    o_offsets = (q_start + token)[:, None] * stride_o_token + head[:, None] * stride_o_head
    tl.store(out_ptr + o_offsets + dims[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_valid[:, None] & dim_valid[None, :])


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    window: int | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Attend each query token to its request's cached keys (causal, optionally windowed).

    Args:
        query: [num_tokens, num_heads, head_size], requests' tokens contiguous.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size] in the model's dtype,
            or int8 rows of head_size codes and head_size / 16 float32 scales
            (kv_cache_dtype="int8", attention/kv_quant.py); this step's K/V already written.
        block_tables: [num_reqs, max_blocks] block ids; seq_lens: [num_reqs] context plus
            this step's tokens; query_start_loc: [num_reqs + 1].
        max_query_len: the longest query (sets the grid; 1 for a decode batch).
        window: a sliding-window layer's size: keys at positions > query - window only.
        out: where to write (same shape as query); a new tensor when None.
        num_splits: decode batches only: programs sharing each request's keys (default:
            `decode_splits`, from the batch's shape).
        max_seq_len: the longest sequence, when the caller knows it (no more shares than
            it has key tiles); None: any length up to the cache's (a captured graph).

    Returns:
        [num_tokens, num_heads, head_size] in the query's dtype.
    """
    num_heads, head_size = query.shape[1], query.shape[2]
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    queries_per_kv = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    if max_query_len <= 1:  # decode: one token, the group's heads as rows
        block_q = 1
        block_m = max(_MIN_DOT, triton.next_power_of_2(queries_per_kv))
    else:
        block_m = max(_PREFILL_ROWS, triton.next_power_of_2(queries_per_kv))
        block_q = block_m // queries_per_kv
    num_reqs = block_tables.shape[0]
    head_pad = max(_MIN_DOT, triton.next_power_of_2(head_size))
    splits = 1
    if max_query_len <= 1:
        splits = num_splits or decode_splits(num_reqs, num_kv_heads, max_seq_len)
    if splits > 1:
        if query.shape[0] != num_reqs:
            raise ValueError("split decoding needs one query token per request.")
        partial = torch.empty(num_reqs, num_heads, splits, head_pad, device=query.device)
        stats = torch.empty(2, num_reqs, num_heads, splits, device=query.device)
        grid = (num_reqs, splits, num_kv_heads)
    else:
        partial = stats = out  # not read
        grid = (num_reqs, triton.cdiv(max(max_query_len, 1), block_q), num_kv_heads)
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    int8_cache = kv_cache.dtype == torch.int8
    key_scales, value_scales = key_cache, value_cache  # not read unless int8
    if int8_cache:  # the rows' scale bytes, read as float32
        if kv_cache.shape[-1] != head_size + head_size // 4 or head_size % 16:
            raise ValueError(
                f"an int8 KV cache of rows of {kv_cache.shape[-1]} bytes does not hold "
                f"head size {head_size}."
            )
        scales = kv_cache.view(torch.float32)
        key_scales, value_scales = scales[0], scales[1]
    round_bf16 = round_bf16_in_software(query.dtype)
    jit_kernel(_paged_attention)[grid](
        out, query, key_cache, value_cache, key_scales, value_scales, block_tables, seq_lens,
        query_start_loc, partial, stats, scale, window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=queries_per_kv, BLOCK_Q=block_q, BLOCK_M=block_m,
        HEAD_SIZE=head_size, HEAD_PAD=head_pad,
        BLOCK_SIZE=block_size, BLOCK_N=_KEY_TILE, USE_WINDOW=window is not None,
        # float32 models keep float32 products (tensor cores would round inputs to tf32).
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        UPCAST_DOT=upcast_dot(query.dtype),
        FLOAT32_Q=upcast_dot(query.dtype) or int8_cache,  # int8 keys come back as float32
        ROUND_BF16=round_bf16,
        ROUND_P=round_bf16 and not int8_cache,  # p meets float32 values from an int8 cache
        NUM_SPLITS=splits, INT8_CACHE=int8_cache,
    )
    if splits > 1:
        out.copy_(split_reduce(partial[..., :head_size], stats[0], stats[1]))
    return out


def decode_splits(num_reqs: int, num_kv_heads: int, max_seq_len: int | None = None) -> int:
    """How many programs share a decode request's keys: enough for about _DECODE_PROGRAMS
    programs in all (a batch of one request on 3 kv heads would otherwise run 3 programs
    on a GPU of 132 SMs), at most _MAX_SPLITS, and no more than the longest sequence has
    key tiles (more would only add empty shares). A captured graph passes no length: its
    split then depends only on the batch's shape."""
    splits = max(1, min(_MAX_SPLITS, _DECODE_PROGRAMS // (num_reqs * num_kv_heads)))
    if max_seq_len is not None:
        splits = min(splits, max(1, triton.cdiv(max_seq_len, _KEY_TILE)))
    return splits


def split_reduce(
    partial: torch.Tensor, maxima: torch.Tensor, sums: torch.Tensor
) -> torch.Tensor:
    """Combine the shares of split decoding: partial [T, H, S, D] unnormalised sums of
    exp(score - max_s) * v, maxima and sums [T, H, S] → [T, H, D] float32 (a share with no
    key has max -inf and weighs 0)."""
    top = maxima.amax(dim=-1, keepdim=True)  # [T, H, 1], finite: every query sees a key
    weights = torch.exp(maxima - top)  # [T, H, S]
    total = (sums * weights).sum(dim=-1)  # [T, H]
    return (partial * weights.unsqueeze(-1)).sum(dim=-2) / total.unsqueeze(-1)
