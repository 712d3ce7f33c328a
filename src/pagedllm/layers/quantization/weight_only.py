"""Weight-only int8 / int4 weights on torch's own CPU kernels (`_weight_int8pack_mm`,
`_weight_int4pack_mm_for_cpu`): activations stay in the model's dtype, weights are
dequantized on the fly. They serve models the byte kernels do not (float32, no C
compiler, the scalar variant), for small decode steps: there reading fewer weight bytes
wins, while larger steps are compute-bound and the dense matmul is 2-3x faster, so a dense
copy serves those (crossover.py) unless keep_dense_weights=False.

int8 is symmetric per output row; int4 asymmetric per 32 input values of a row,
w = (q - 8) * scale + zero with q in 0..15 (a GGUF Q4_1 block, w = d * q + m, is exactly
this with scale = d and zero = m + 8 d).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.config import QUANTIZATION_METHODS
from pagedllm.layers.quantization.base import QuantizedMethod
from pagedllm.layers.quantization.codes import INT4_GROUP_SIZE, fp8_grid, int4_group_codes

# Steps of at most this many tokens use torch's int8/int4 weights when a dense copy is also
# kept: there reading fewer weight bytes wins; larger steps are compute-bound and the dense
# oneDNN matmul is 2-3x faster than those kernels.
QUANTIZED_MAX_TOKENS = 8
_QUANTIZE_CHUNK_ROWS = 4096
# torch's CPU int4 kernel works on whole tiles of output rows and of input columns.
_INT4_ROW_MULTIPLE = 16
_INT4_MID = 8


@dataclass
class Int8Weight(QuantizedMethod):
    """int8 codes [out, in] with one scale per output row: w = q * scale."""

    codes: torch.Tensor
    scales: torch.Tensor

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ w^T → [T, out] in x's dtype."""
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight q * scale."""
        return (self.codes.float() * self.scales.float()[:, None]).to(dtype)

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.codes.nbytes + self.scales.nbytes


@dataclass
class Int4Weight(QuantizedMethod):
    """Packed int4 codes with per-group (scale, zero) pairs [in / group, out, 2]."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    group_size: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ w^T → [T, out] in x's dtype."""
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, self.group_size, self.scales_and_zeros
        )

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight, read back through the kernel (an identity input)."""
        in_features = self.scales_and_zeros.shape[0] * self.group_size
        eye = torch.eye(in_features, dtype=self.scales_and_zeros.dtype)
        return self.matmul(eye).t().contiguous().to(dtype)

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.packed.nbytes + self.scales_and_zeros.nbytes


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


def quantize(weight: torch.Tensor, method: str) -> Int8Weight | Int4Weight | None:
    """`weight` [out, in] in `method` ("int8", "int4", or "fp8": FP8-rounded then int8,
    no CPU kernel reading FP8); None when the shape does not fit."""
    if method == "int8":
        return quantize_int8(weight)
    if method == "fp8":
        return quantize_int8(fp8_grid(weight))
    if method == "int4":
        return quantize_int4(weight) if can_quantize_int4(weight) else None
    raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {method!r}.")
