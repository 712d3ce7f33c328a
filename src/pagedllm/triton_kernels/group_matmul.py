"""x @ W^T with W stored as 4- or 8-bit codes in groups along the input (W4A16 / W8A16).

The weight format is a GGUF file's, unchanged (layers/quantization.py GroupCodes): each
output row is cut into groups of 32 inputs; a group has codes q, and per scale group (the
whole 32, or each half of 16 for Q6_K) a float32 scale s and, for asymmetric formats, a
minimum m: w = q * s + m. 4-bit codes are packed two per byte as GGUF packs them, input j
of a group in the low nibble of byte j and input j + 16 in its high nibble; 8-bit codes are
one signed byte each (Q8_0, Q6_K, and Q5_K's 0..31 with minimums).

Each program computes a [BLOCK_M, BLOCK_N] tile of the output: per group it loads the
codes of BLOCK_N rows once, turns each half-group into weights in float32 (q * s + m),
rounds them to the activations' dtype (what the dense weight would hold) and multiplies on
the tensor cores, accumulating in float32. Small batches read the weight once: to keep
every SM busy when M is small and N too, the input dimension is split over SPLIT_K
programs whose float32 partial sums are added afterwards (no atomics, so a row's result
never depends on which program finished first). The split depends only on the weight's
shape, so a token's result is the same whatever batch it runs in.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedllm.triton_kernels.runtime import jit_kernel, round_bf16_in_software, upcast_dot

GROUP = 32
_HALF = 16
_BLOCK_N = 64
# Programs the grid should have at least (about two per SM of an H100-class GPU).
_TARGET_PROGRAMS = 256
_MIN_GROUPS_PER_SPLIT = 4


def _group_matmul(
    x_ptr, codes_ptr, scales_ptr, mins_ptr, out_ptr, M, N, groups_per_split,
    stride_x, stride_codes, stride_scales, stride_mins, stride_out_split, stride_out,
    BITS: tl.constexpr, HALF_SCALES: tl.constexpr, HAS_MINS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid = rows < M
    col_valid = cols < N
    half = tl.arange(0, 16)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    first_group = split * groups_per_split
    for g in range(first_group, first_group + groups_per_split):
        x_row = x_ptr + rows[:, None] * stride_x + g * 32 + half[None, :]
        x_lo = tl.load(x_row, mask=row_valid[:, None], other=0.0)  # [BLOCK_M, 16]
        x_hi = tl.load(x_row + 16, mask=row_valid[:, None], other=0.0)
        code_row = codes_ptr + cols[:, None] * stride_codes
        if BITS == 4:
            packed = tl.load(code_row + g * 16 + half[None, :], mask=col_valid[:, None],
                             other=0)  # [BLOCK_N, 16] uint8
            q_lo = (packed & 0x0F).to(tl.float32)
            q_hi = (packed >> 4).to(tl.float32)
        else:
            q_lo = tl.load(code_row + g * 32 + half[None, :], mask=col_valid[:, None],
                           other=0).to(tl.float32)
            q_hi = tl.load(code_row + g * 32 + 16 + half[None, :], mask=col_valid[:, None],
                           other=0).to(tl.float32)
        scale_row = scales_ptr + cols * stride_scales
        if HALF_SCALES:
            s_lo = tl.load(scale_row + 2 * g, mask=col_valid, other=0.0)
            s_hi = tl.load(scale_row + 2 * g + 1, mask=col_valid, other=0.0)
        else:
            s_lo = tl.load(scale_row + g, mask=col_valid, other=0.0)
            s_hi = s_lo
        w_lo = q_lo * s_lo[:, None]
        w_hi = q_hi * s_hi[:, None]
        if HAS_MINS:  # minimums are per group of 32 (no format has them per half)
            m = tl.load(mins_ptr + cols * stride_mins + g, mask=col_valid, other=0.0)
            w_lo += m[:, None]
            w_hi += m[:, None]
        # The weight as the dense copy would hold it, then the product in float32.
        if ROUND_BF16:  # the interpreter's cast truncates: round to nearest even first
            lo_bits = w_lo.to(tl.uint32, bitcast=True)
            hi_bits = w_hi.to(tl.uint32, bitcast=True)
            lo_bits += 0x7FFF + ((lo_bits >> 16) & 1)
            hi_bits += 0x7FFF + ((hi_bits >> 16) & 1)
            w_lo = lo_bits.to(tl.float32, bitcast=True)
            w_hi = hi_bits.to(tl.float32, bitcast=True)
        w_lo = w_lo.to(x_ptr.dtype.element_ty)
        w_hi = w_hi.to(x_ptr.dtype.element_ty)
        if UPCAST_DOT:
            x_lo, x_hi = x_lo.to(tl.float32), x_hi.to(tl.float32)
            w_lo, w_hi = w_lo.to(tl.float32), w_hi.to(tl.float32)
        acc += tl.dot(x_lo, tl.trans(w_lo), input_precision=DOT_PRECISION)
        acc += tl.dot(x_hi, tl.trans(w_hi), input_precision=DOT_PRECISION)
    out = out_ptr + split * stride_out_split + rows[:, None] * stride_out + cols[None, :]
    tl.store(out, acc, mask=row_valid[:, None] & col_valid[None, :])


def split_k_for(out_features: int, groups: int) -> int:
    """How many programs share a row tile's input groups for a weight of this shape."""
    col_tiles = triton.cdiv(out_features, _BLOCK_N)
    wanted = max(1, _TARGET_PROGRAMS // col_tiles)
    # Whole, equal shares of the groups, each of at least a few groups.
    best = 1
    for split in range(1, min(wanted, groups // _MIN_GROUPS_PER_SPLIT) + 1):
        if groups % split == 0:
            best = split
    return best


def group_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor | None,
    bits: int,
    split_k: int | None = None,
) -> torch.Tensor:
    """x [M, K] @ W^T → [M, N] in x's dtype, W given by its group codes.

    Args:
        codes: [N, K / 2] uint8 (bits=4, two codes a byte) or [N, K] int8 (bits=8).
        scales: [N, K / 32] float32, or [N, K / 16] for a scale per half-group.
        mins: [N, K / 32] float32 minimums, or None (w = q * s).
        split_k: programs per row tile along K (default: from the weight's shape).
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_rows, in_features = x.shape
    out_features = codes.shape[0]
    groups = in_features // GROUP
    half_scales = scales.shape[1] == 2 * groups
    split = split_k or split_k_for(out_features, groups)
    block_m = 16 if num_rows <= 16 else 64
    partial = torch.empty(split, num_rows, out_features, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(num_rows, block_m), triton.cdiv(out_features, _BLOCK_N), split)
    jit_kernel(_group_matmul)[grid](
        x, codes, scales, scales if mins is None else mins, partial,
        num_rows, out_features, groups // split,
        x.stride(0), codes.stride(0), scales.stride(0),
        scales.stride(0) if mins is None else mins.stride(0),
        partial.stride(0), partial.stride(1),
        BITS=bits, HALF_SCALES=half_scales, HAS_MINS=mins is not None,
        BLOCK_M=block_m, BLOCK_N=_BLOCK_N,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST_DOT=upcast_dot(x.dtype), ROUND_BF16=round_bf16_in_software(x.dtype),
        # q * s + m rounded twice, as the file's dequantization (and the dense weight)
        # computes it: a fused multiply-add would round once and shift some weights.
        enable_fp_fusion=False,
    )
    summed = partial[0] if split == 1 else partial.sum(0)
    return summed.to(x.dtype)
