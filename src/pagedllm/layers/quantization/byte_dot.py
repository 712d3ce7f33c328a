"""The byte dot-product formats: int4 / int8 weights in groups of 32 multiplied by int8
activations in our C kernels (csrc/w4a8.c), for bfloat16 models on CPU.

W4A8Weight holds asymmetric int4 groups (w = d * q + m, Q4_1's form), W8A8Weight GGUF
Q8_0's symmetric int8 groups (the LM head); both in panels of 16 output rows, codes as the
byte dot-product instructions read them, activations quantized per token and 16 values on
the fly. The kernels are at least as fast as the dense bfloat16 matmul at every step size
on vector units, so these weights serve every step and no dense copy of the decoder's
matrices is kept (except where matrix units win large steps: crossover.py); the CPU
decode stack (worker/decode_step/cpu_stack.py) chains them over all layers in one C call.
SplitWeight holds the GGUF formats no single layout holds (Q6_K, Q5_K) as the sum of two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.kernels.abi import FMT_INT4, FMT_INT4_F16, FMT_INT4_SYM_F16
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization.base import QuantizedMethod
from pagedllm.layers.quantization.codes import INT4_GROUP_SIZE, GroupCodes, int4_group_codes
from pagedllm.platform import get_platform

# Output rows per panel of the W4A8/W8A8 layouts (one AVX-512 vector of float32).
PANEL_ROWS = 16
_QUANTIZE_CHUNK_ROWS = 4096


def _kernel_rows(x: torch.Tensor, format_name: str) -> torch.Tensor:
    """x as the byte dot-product kernels take it: bfloat16 with dense rows."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"{format_name} takes bfloat16 activations, got {x.dtype}.")
    return x if x.stride(-1) == 1 else x.contiguous()


@dataclass
class W4A8Weight(QuantizedMethod):
    """int4 codes in groups of 32 multiplied by int8 activations (bfloat16 models on CPU).

    Same weight format as Int4Weight (w = d * q + m per group, Q4_1's), stored for the C
    kernels (kernels/csrc/w4a8.c) in panels of 16 output rows, codes as the byte dot-product
    instructions read them, (d, m) in float16 where every one is a float16 (GGUF Q4_0 /
    Q4_1 scales are: 0.625 bytes a weight), else in float32 (0.75); where every m is -8 d
    (Q4_0), the float16 d alone (0.5625 bytes a weight, as llama.cpp's). Activations are
    quantized to int8 on the fly per token and 16 values (llama.cpp uses 32; half-groups
    cut the error against float32 by a fifth, benchmarks/accuracy.py), so one VNNI
    instruction does 64 multiply-adds. On
    every ISA with a vector variant it is faster than torch's dense matmul on the same CPU
    (benchmarks/matmul.py), so bfloat16 CPU models keep no dense copy of these matrices.
    """

    packed: torch.Tensor  # [panels, in / 32, 256] uint8
    # [panels, in / 32, 2, 16] float32 or float16: d, then m; or [panels, in / 32, 1, 16]
    # float16: d alone, m = -8 d (Q4_0's symmetric codes).
    scales_and_mins: torch.Tensor
    out_features: int

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
        stored = self.scales_and_mins.float().permute(0, 3, 2, 1)
        scales_and_mins = stored.reshape(-1, stored.shape[2], groups)
        scales = scales_and_mins[:, 0, :, None]
        mins = scales * -8.0 if self.symmetric else scales_and_mins[:, 1, :, None]
        return (codes * scales + mins).view(codes.shape[0], -1)[: self.out_features].to(dtype)

    @property
    def symmetric(self) -> bool:
        """True when only the scales are stored (every minimum is -8 d)."""
        return self.scales_and_mins.shape[2] == 1

    def kernel_format(self) -> int:
        """The kernels' name for this layout (kernels.h FMT_*)."""
        if self.scales_and_mins.dtype != torch.float16:
            return FMT_INT4
        return FMT_INT4_SYM_F16 if self.symmetric else FMT_INT4_F16

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.packed.nbytes + self.scales_and_mins.nbytes


@dataclass
class W8A8Weight(QuantizedMethod):
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
class SplitWeight(QuantizedMethod):
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


def can_quantize_w4a8(weight: torch.Tensor) -> bool:
    """True when `weight` can be a W4A8Weight (or W8A8Weight) here: bfloat16 on CPU, input
    columns a multiple of 32, and the C kernel built."""
    return weight.shape[1] % INT4_GROUP_SIZE == 0 and get_platform(
        weight.device
    ).byte_dot_kernels(weight.dtype)


def _num_panels(rows: int) -> int:
    return -(-rows // PANEL_ROWS)


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
    return W4A8Weight(packed, _compact_scales(scales_and_mins), rows)


def _compact_scales(scales_and_mins: torch.Tensor) -> torch.Tensor:
    """[panels, groups, 2, 16] float32 scales and minimums as the kernels read the fewest
    bytes of them for the same products: float16 when that keeps every one exactly, and the
    scales alone when every minimum is -8 times its scale (Q4_0)."""
    half = scales_and_mins.to(torch.float16)
    if not torch.equal(half.float(), scales_and_mins):
        return scales_and_mins
    scales, mins = scales_and_mins[:, :, :1], scales_and_mins[:, :, 1:]
    return half[:, :, :1].contiguous() if torch.equal(mins, scales * -8.0) else half


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
    """`weight` [out, in] as int4 groups of 32 in the W4A8 layout (see can_quantize_w4a8),
    each group's d and m rounded to float16 as Q4_1 stores them (0.625 bytes a weight)."""
    if not can_quantize_w4a8(weight):
        raise ValueError(f"W4A8 needs a bfloat16 CPU weight with in % 32 == 0, got {weight.shape}.")
    rows, cols = weight.shape
    groups = cols // INT4_GROUP_SIZE
    packed = torch.empty(_num_panels(rows), groups, 256, dtype=torch.uint8)
    scales_and_mins = torch.empty(_num_panels(rows), groups, 2, PANEL_ROWS)
    # By row chunks: a vocabulary matrix in float32 temporaries would be several 100 MB.
    for start in range(0, rows, _QUANTIZE_CHUNK_ROWS):
        chunk = weight[start : start + _QUANTIZE_CHUNK_ROWS]
        codes, scales, mins = int4_group_codes(chunk, INT4_GROUP_SIZE, half=True)
        _pack_int4(packed, scales_and_mins, start, codes, scales, mins)
    return W4A8Weight(packed, _compact_scales(scales_and_mins), rows)


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
