"""Weight-only quantization for CPU decode: int8 per output channel and int4 in groups of 32.

At batch sizes of a few tokens a decode step is bound by reading the weights, so storing
them in fewer bits makes it faster in proportion. Activations stay in the model dtype; torch's
CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) dequantize on the fly.

The int4 format is asymmetric, one (scale, zero) pair per 32 input values of an output row:
w = (q - 8) * scale + zero with q in 0..15. A GGUF Q4_1 block (w = d * q + m over 32 values,
q from its own min/max) is exactly this format with scale = d and zero = m + 8 d, so
re-quantizing Q4_1 weights recovers their codes and loses nothing but the rounding of the
scales to the model dtype.

Two exceptions to "weight-only", for bfloat16 models on CPU (our C kernel, csrc/w4a8.c):
W4A8Weight, the same int4 format multiplied by activations quantized to int8 per 16 values,
and W8A8Weight, GGUF Q8_0's int8 form (the LM head) multiplied the same way. The kernel is
at least as fast as the dense bfloat16 matmul at every step size, so these weights serve every step
and no dense copy of the decoder's matrices is kept; the CPU decode stack
(models/cpu_decode_stack.py) chains it over all layers in one C call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedllm.config import QUANTIZATION_METHODS
from pagedllm.layers import cpu_ops
from pagedllm.platform import get_platform

INT4_GROUP_SIZE = 32
# Steps of at most this many tokens use torch's int8/int4 weights when a dense copy is also
# kept: there reading fewer weight bytes wins; larger steps are compute-bound and the dense
# oneDNN matmul is 2-3x faster than those kernels. Each weight carries its limit
# (`max_tokens`, None: every step).
QUANTIZED_MAX_TOKENS = 8
# Output rows per panel of the W4A8/W8A8 layouts (one AVX-512 vector of float32).
PANEL_ROWS = 16
_QUANTIZE_CHUNK_ROWS = 4096
# torch's CPU int4 kernel works on whole tiles of output rows and of input columns.
_INT4_ROW_MULTIPLE = 16
_INT4_MID = 8


def _kernel_rows(x: torch.Tensor, format_name: str) -> torch.Tensor:
    """x as the byte dot-product kernels take it: bfloat16 with dense rows."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"{format_name} takes bfloat16 activations, got {x.dtype}.")
    return x if x.stride(-1) == 1 else x.contiguous()


@dataclass
class Int8Weight:
    """int8 codes [out, in] with one scale per output row: w = q * scale."""

    codes: torch.Tensor
    scales: torch.Tensor
    max_tokens: int = QUANTIZED_MAX_TOKENS

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ w^T → [T, out] in x's dtype."""
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.codes.nbytes + self.scales.nbytes


@dataclass
class Int4Weight:
    """Packed int4 codes with per-group (scale, zero) pairs [in / group, out, 2]."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    group_size: int
    max_tokens: int = QUANTIZED_MAX_TOKENS

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ w^T → [T, out] in x's dtype."""
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, self.group_size, self.scales_and_zeros
        )

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.packed.nbytes + self.scales_and_zeros.nbytes


@dataclass
class W4A8Weight:
    """int4 codes in groups of 32 multiplied by int8 activations (bfloat16 models on CPU).

    Same weight format as Int4Weight (w = d * q + m per group, Q4_1's), stored for the C
    kernels (kernels/csrc/w4a8.c) in panels of 16 output rows, codes as the byte dot-product
    instructions read them, (d, m) in float32. Activations are quantized to int8 on the fly
    per token and 16 values (llama.cpp uses 32; half-groups cut the error against float32
    by a fifth, benchmarks/accuracy.py), so one VNNI instruction does 64 multiply-adds. On
    every ISA with a vector variant it is faster than torch's dense matmul on the same CPU
    (benchmarks/matmul.py), so bfloat16 CPU models keep no dense copy of these matrices.
    """

    packed: torch.Tensor  # [panels, in / 32, 256] uint8
    scales_and_mins: torch.Tensor  # [panels, in / 32, 2, 16] float32: scales, then minimums
    out_features: int
    max_tokens: int | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] bfloat16 @ w^T → [T, out] bfloat16."""
        return cpu_ops.w4a8_matmul(
            _kernel_rows(x, "W4A8"), self.packed, self.scales_and_mins, self.out_features
        )

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight d * q + m, computed in float32 from the codes."""
        panels, groups = self.packed.shape[:2]
        blocks = self.packed.view(panels, groups, 4, PANEL_ROWS, 4)
        quads = torch.cat([blocks & 0x0F, blocks >> 4], dim=2)  # [panels, groups, 8, 16, 4]
        codes = _panel_rows(quads, groups).float()  # [rows, groups, 32]
        scales_and_mins = self.scales_and_mins.permute(0, 3, 2, 1).reshape(-1, 2, groups)
        scales, mins = scales_and_mins[:, 0, :, None], scales_and_mins[:, 1, :, None]
        return (codes * scales + mins).view(codes.shape[0], -1)[: self.out_features].to(dtype)

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.packed.nbytes + self.scales_and_mins.nbytes


@dataclass
class W8A8Weight:
    """int8 codes in groups of 32 multiplied by int8 activations (bfloat16 models on CPU).

    GGUF Q8_0's form, w = d * q with q in -127..127 and one float32 d per group, in the same
    panels as W4A8Weight: codes stored as q + 128 (unsigned bytes, as the VNNI instruction
    wants them). The LM head uses it: GGUF files keep the vocabulary matrix at 8 bits, and
    at 4 bits its noise over 49k logits shifts their normaliser (perplexity +4% on natural
    text, measured), while this keeps it within 0.5%.
    """

    codes: torch.Tensor  # [panels, in / 32, 512] uint8
    scales: torch.Tensor  # [panels, in / 32, 16] float32
    out_features: int
    max_tokens: int | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] bfloat16 @ w^T → [T, out] bfloat16."""
        return cpu_ops.w8a8_matmul(
            _kernel_rows(x, "W8A8"), self.codes, self.scales, self.out_features
        )

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight d * q, computed in float32 from the codes."""
        panels, groups = self.codes.shape[:2]
        quads = self.codes.view(panels, groups, 8, PANEL_ROWS, 4)
        codes = _panel_rows(quads, groups).float() - 128  # [rows, groups, 32]
        scales = self.scales.permute(0, 2, 1).reshape(-1, groups, 1)
        return (codes * scales).view(codes.shape[0], -1)[: self.out_features].to(dtype)

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.codes.nbytes + self.scales.nbytes


def _panel_quads(codes: torch.Tensor) -> torch.Tensor:
    """Codes [rows, groups, 32] (rows a multiple of 16) → [panels, groups, 8, 16, 4]: per
    panel and group, quad j holds inputs 4j..4j+3 of the 16 rows, row by row."""
    rows, groups, _ = codes.shape
    return codes.view(rows // PANEL_ROWS, PANEL_ROWS, groups, 8, 4).permute(0, 2, 3, 1, 4)


def _panel_rows(quads: torch.Tensor, groups: int) -> torch.Tensor:
    """The inverse of _panel_quads: [panels, groups, 8, 16, 4] → [rows, groups, 32]."""
    return quads.permute(0, 3, 1, 2, 4).reshape(-1, groups, INT4_GROUP_SIZE)


def _panel_scales(values: torch.Tensor) -> torch.Tensor:
    """Per-row values [rows, groups] → [panels, groups, 16]."""
    rows, groups = values.shape
    return values.view(rows // PANEL_ROWS, PANEL_ROWS, groups).transpose(1, 2)


@dataclass
class SplitWeight:
    """A GGUF weight no single byte dot-product layout holds, kept exactly as the sum of two
    that do; x @ w^T is the sum of their products, for twice the bytes of one.

    - Q6_K (an int8 scale per 16 values): two W8A8 weights, each keeping one half of every
      group's codes (the other half zero) with that half's scale.
    - Q5_K (5-bit codes q = 16 h + l with a minimum): two W4A8 weights, the low nibbles l
      with the group's scale and minimum, and the fifth bits h with 16 times the scale.
    A kernel with 16-value groups, or 5-bit codes, would need only one.
    """

    first: W8A8Weight | W4A8Weight
    second: W8A8Weight | W4A8Weight
    out_features: int
    max_tokens: int | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] bfloat16 @ w^T → [T, out] bfloat16."""
        return self.first.matmul(x) + self.second.matmul(x)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight, computed in float32 from the codes."""
        return (self.first.dense(torch.float32) + self.second.dense(torch.float32)).to(dtype)

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.first.nbytes() + self.second.nbytes()


def _split_w8a8(codes: GroupCodes) -> SplitWeight:
    """Half-group-scaled int8 codes as two W8A8 weights (see SplitWeight)."""
    rows, groups, _ = codes.codes.shape
    halves = codes.codes.view(rows, groups, 2, 16)
    parts = []
    for half in (0, 1):
        kept = torch.zeros_like(halves)
        kept[:, :, half] = halves[:, :, half]
        scales = codes.scales[..., half].contiguous()
        part = w8a8_from_codes(GroupCodes(kept.view(rows, groups, 32), scales, None))
        assert isinstance(part, W8A8Weight)
        parts.append(part)
    return SplitWeight(parts[0], parts[1], rows)


def _split_w4a8(codes: GroupCodes) -> SplitWeight:
    """5-bit codes with minimums as two W4A8 weights (see SplitWeight)."""
    assert codes.mins is not None
    low = GroupCodes(codes.codes & 0x0F, codes.scales, codes.mins)
    high = GroupCodes(codes.codes >> 4, codes.scales * 16, torch.zeros_like(codes.mins))
    parts = (w4a8_from_codes(low), w4a8_from_codes(high))
    assert isinstance(parts[0], W4A8Weight) and isinstance(parts[1], W4A8Weight)
    return SplitWeight(parts[0], parts[1], codes.shape[0])


QuantizedWeight = Int8Weight | Int4Weight | W4A8Weight | W8A8Weight | SplitWeight


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric int8 per output row (scale = max |w| / 127), scales in the weight's dtype."""
    codes = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(weight.shape[0])
    for start in range(0, weight.shape[0], _QUANTIZE_CHUNK_ROWS):  # bounded temporaries
        chunk = slice(start, start + _QUANTIZE_CHUNK_ROWS)
        w = weight[chunk].float()
        scales[chunk] = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        codes[chunk] = (w / scales[chunk, None]).round().clamp(-127, 127).to(torch.int8)
    return Int8Weight(codes, scales.to(weight.dtype))


def can_quantize_int4(weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> bool:
    """True when the weight's shape fits torch's CPU int4 kernel."""
    rows, cols = weight.shape
    return rows % _INT4_ROW_MULTIPLE == 0 and cols % group_size == 0


def can_quantize_w4a8(weight: torch.Tensor) -> bool:
    """True when `weight` can be a W4A8Weight (or W8A8Weight) here: bfloat16 on CPU, input
    columns a multiple of 32, and the C kernel built."""
    return weight.shape[1] % INT4_GROUP_SIZE == 0 and get_platform(
        weight.device
    ).byte_dot_kernels(weight.dtype)


def int4_group_codes(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [out, groups, group_size] in 0..15, scales d, minimums m), w = d * q + m."""
    rows, cols = weight.shape
    groups = weight.float().view(rows, cols // group_size, group_size)
    low = groups.amin(dim=-1)
    scales = ((groups.amax(dim=-1) - low) / 15.0).clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15)
    return codes, scales, low


def _num_panels(rows: int) -> int:
    return -(-rows // PANEL_ROWS)


@dataclass
class GroupCodes:
    """A weight as a GGUF file stores it: codes in groups of 32 per output row, each group
    with a float32 scale d and (int4) a minimum m. int4: w = d * q + m, q in 0..15 (Q4_1;
    Q4_0 is d * (q - 8), i.e. m = -8 d; Q4_K's sub-blocks), or q in 0..31 for Q5_K; int8:
    w = d * q, q in -127..127 (Q8_0; Q5_0 as q - 16). Q6_K's sub-blocks of 16 have a scale
    each: int8 codes q - 32 with scales [rows, groups, 2], one per half-group
    (`has_half_scales`).

    The loader hands these to the layers instead of dense tensors when the weights will run
    on the byte dot-product kernels: they become W4A8Weight / W8A8Weight exactly, with the
    file's own scales, and no dense copy is ever made.
    """

    codes: torch.Tensor  # [rows, groups, 32] uint8 (int4) or int8 (int8)
    scales: torch.Tensor  # [rows, groups] float32, or [rows, groups, 2] per half-group
    mins: torch.Tensor | None  # [rows, groups] float32 for int4, None for int8
    # The inputs in the codes' order (None: the layer's own): code column j multiplies
    # input input_perm[j] (GPTQ act-order, whose groups gather inputs from anywhere).
    input_perm: torch.Tensor | None = None

    @property
    def has_half_scales(self) -> bool:
        """True for int8 codes with a scale per 16 values (Q6_K)."""
        return self.scales.dim() == 3

    def with_half_scales(self) -> GroupCodes:
        """The same int8 weight with one scale per half-group (each group's scale twice)."""
        if self.has_half_scales:
            return self
        return GroupCodes(self.codes, self.scales[..., None].expand(-1, -1, 2).contiguous(), None)

    @property
    def is_int4(self) -> bool:
        """True for the 4-bit form (with minimums)."""
        return self.mins is not None

    @property
    def shape(self) -> tuple[int, int]:
        """The dense weight's shape [out, in]."""
        rows, groups, _ = self.codes.shape
        return rows, groups * INT4_GROUP_SIZE

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> GroupCodes:
        """The same weight with `fn` (a row permutation) applied to every part's rows."""
        mins = None if self.mins is None else fn(self.mins)
        return GroupCodes(fn(self.codes), fn(self.scales), mins, self.input_perm)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight, computed in float32 as the file defines it."""
        if self.has_half_scales:
            rows, groups, _ = self.codes.shape
            halves = self.codes.float().view(rows, groups, 2, 16) * self.scales[..., None]
            return halves.view(self.shape).to(dtype)
        values = self.codes.float() * self.scales[..., None]
        if self.mins is not None:
            values += self.mins[..., None]
        values = values.view(self.shape)
        if self.input_perm is not None:  # back to the layer's input order
            ordered = torch.empty_like(values)
            ordered[:, self.input_perm] = values
            values = ordered
        return values.to(dtype)


def w4a8_from_codes(codes: GroupCodes) -> W4A8Weight | SplitWeight:
    """An int4 GroupCodes weight in the W4A8 layout, exactly (its codes and scales kept);
    5-bit codes (Q5_K) as two W4A8 weights (see SplitWeight)."""
    assert codes.mins is not None, "int4 codes have minimums"
    if int(codes.codes.max()) > 15:
        return _split_w4a8(codes)
    rows, groups, _ = codes.codes.shape
    packed = torch.empty(_num_panels(rows), groups, 256, dtype=torch.uint8)
    scales_and_mins = torch.empty(_num_panels(rows), groups, 2, PANEL_ROWS)
    for start in range(0, rows, _QUANTIZE_CHUNK_ROWS):
        chunk = slice(start, start + _QUANTIZE_CHUNK_ROWS)
        _pack_int4(packed, scales_and_mins, start, codes.codes[chunk], codes.scales[chunk],
                   codes.mins[chunk])
    return W4A8Weight(packed, scales_and_mins, rows)


def w8a8_from_codes(codes: GroupCodes) -> W8A8Weight | SplitWeight:
    """An int8 GroupCodes weight in the W8A8 layout, exactly (with half-group scales: as
    two W8A8 weights, see SplitWeight)."""
    if codes.has_half_scales:
        return _split_w8a8(codes)
    rows, groups, _ = codes.codes.shape
    stored = torch.empty(_num_panels(rows), groups, 512, dtype=torch.uint8)
    scales = torch.empty(_num_panels(rows), groups, PANEL_ROWS)
    for start in range(0, rows, _QUANTIZE_CHUNK_ROWS):
        chunk = slice(start, start + _QUANTIZE_CHUNK_ROWS)
        unsigned = (codes.codes[chunk].to(torch.int16) + 128).to(torch.uint8)
        _pack_int8(stored, scales, start, unsigned, codes.scales[chunk])
    return W8A8Weight(stored, scales, rows)


def _pad_rows(x: torch.Tensor) -> torch.Tensor:
    """x [rows, ...] zero-padded to whole panels of rows."""
    missing = -x.shape[0] % PANEL_ROWS
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, missing)) if missing else x


def _pack_int4(
    packed: torch.Tensor, scales_and_mins: torch.Tensor, start: int, codes: torch.Tensor,
    scales: torch.Tensor, mins: torch.Tensor,
) -> None:
    """Rows start.. of an int4 weight (codes [n, groups, 32] in 0..15) into the W4A8 layout."""
    codes, scales, mins = _pad_rows(codes.to(torch.uint8)), _pad_rows(scales), _pad_rows(mins)
    groups = codes.shape[1]
    panels = slice(start // PANEL_ROWS, start // PANEL_ROWS + codes.shape[0] // PANEL_ROWS)
    quads = _panel_quads(codes)
    # Block b of a group: quad b in the low nibbles, quad b + 4 in the high ones.
    packed[panels] = (quads[:, :, :4] | (quads[:, :, 4:] << 4)).reshape(-1, groups, 256)
    scales_and_mins[panels, :, 0] = _panel_scales(scales)
    scales_and_mins[panels, :, 1] = _panel_scales(mins)


def _pack_int8(
    stored: torch.Tensor, scales: torch.Tensor, start: int, unsigned: torch.Tensor,
    step: torch.Tensor,
) -> None:
    """Rows start.. of an int8 weight (codes + 128 as uint8 [n, groups, 32]) into W8A8's."""
    unsigned, step = _pad_rows(unsigned), _pad_rows(step)
    groups = unsigned.shape[1]
    panels = slice(start // PANEL_ROWS, start // PANEL_ROWS + unsigned.shape[0] // PANEL_ROWS)
    stored[panels] = _panel_quads(unsigned).reshape(-1, groups, 512)
    scales[panels] = _panel_scales(step)


def quantize_w4a8(weight: torch.Tensor) -> W4A8Weight:
    """`weight` [out, in] as int4 groups of 32 in the W4A8 layout (see can_quantize_w4a8)."""
    if not can_quantize_w4a8(weight):
        raise ValueError(f"W4A8 needs a bfloat16 CPU weight with in % 32 == 0, got {weight.shape}.")
    rows, cols = weight.shape
    groups = cols // INT4_GROUP_SIZE
    packed = torch.empty(_num_panels(rows), groups, 256, dtype=torch.uint8)
    scales_and_mins = torch.empty(_num_panels(rows), groups, 2, PANEL_ROWS)
    # By row chunks: a vocabulary matrix in float32 temporaries would be several 100 MB.
    for start in range(0, rows, _QUANTIZE_CHUNK_ROWS):
        chunk = weight[start : start + _QUANTIZE_CHUNK_ROWS]
        codes, scales, mins = int4_group_codes(chunk, INT4_GROUP_SIZE)
        _pack_int4(packed, scales_and_mins, start, codes, scales, mins)
    return W4A8Weight(packed, scales_and_mins, rows)


def quantize_w8a8(weight: torch.Tensor) -> W8A8Weight:
    """`weight` [out, in] as int8 groups of 32 (d = max |w| / 127) in the W8A8 layout (same
    conditions as can_quantize_w4a8)."""
    if not can_quantize_w4a8(weight):
        raise ValueError(f"W8A8 needs a bfloat16 CPU weight with in % 32 == 0, got {weight.shape}.")
    rows, cols = weight.shape
    groups = cols // INT4_GROUP_SIZE
    stored = torch.empty(_num_panels(rows), groups, 512, dtype=torch.uint8)
    scales = torch.empty(_num_panels(rows), groups, PANEL_ROWS)
    for start in range(0, rows, _QUANTIZE_CHUNK_ROWS):
        chunk = weight[start : start + _QUANTIZE_CHUNK_ROWS].float()
        chunk = chunk.view(-1, groups, INT4_GROUP_SIZE)
        step = (chunk.abs().amax(dim=-1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        q = (chunk / step[..., None]).round().clamp(-127, 127) + 128
        _pack_int8(stored, scales, start, q.to(torch.uint8), step)
    return W8A8Weight(stored, scales, rows)


def quantize_int4(weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Weight:
    """Asymmetric int4 per `group_size` input values of each output row (min/max codes)."""
    if not can_quantize_int4(weight, group_size):
        raise ValueError(
            f"int4 needs output rows divisible by {_INT4_ROW_MULTIPLE} and input columns by "
            f"{group_size}; got weight shape {tuple(weight.shape)}."
        )
    rows, cols = weight.shape
    codes, scales, low = int4_group_codes(weight, group_size)
    zeros = low + _INT4_MID * scales
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        codes.view(rows, cols).to(torch.int32), 1
    )
    # The kernel wants [in / group, out, (scale, zero)] in the activation dtype.
    scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(weight.dtype)
    return Int4Weight(packed, scales_and_zeros.contiguous(), group_size)


def dequantize(weight: QuantizedWeight, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """The dense [out, in] weight a quantized weight stands for (for tests and checks)."""
    if isinstance(weight, (W4A8Weight, W8A8Weight, SplitWeight)):
        return weight.dense(dtype)
    eye = torch.eye(in_features, dtype=dtype)
    return weight.matmul(eye).t().contiguous()


FP8_MAX = 448.0  # the largest float8 e4m3 value


def fp8_grid(weight: torch.Tensor) -> torch.Tensor:
    """`weight` rounded to float8 e4m3 with one scale per tensor (vLLM's dynamic "fp8"
    weights: scale = max |w| / 448), in `weight`'s dtype."""
    scale = (weight.abs().amax().float() / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    codes = (weight.float() / scale).to(torch.float8_e4m3fn)
    return (codes.float() * scale).to(weight.dtype)


def quantize(weight: torch.Tensor, method: str) -> QuantizedWeight | None:
    """`weight` [out, in] in `method` ("int8", "int4", or "fp8": FP8-rounded then int8,
    no CPU kernel reading FP8); None when the shape does not fit."""
    if method == "int8":
        return quantize_int8(weight)
    if method == "fp8":
        return quantize_int8(fp8_grid(weight))
    if method == "int4":
        return quantize_int4(weight) if can_quantize_int4(weight) else None
    raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {method!r}.")
