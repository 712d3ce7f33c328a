"""Weight-only quantization for CPU decode: int8 per output channel and int4 in groups of 32.

At batch sizes of a few tokens a decode step is bound by reading the weights, so storing
them in fewer bits makes it faster in proportion. Activations stay in the model dtype; torch's
CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) dequantize on the fly.

The int4 format is asymmetric, one (scale, zero) pair per 32 input values of an output row:
w = (q - 8) * scale + zero with q in 0..15. A GGUF Q4_1 block (w = d * q + m over 32 values,
q from its own min/max) is exactly this format with scale = d and zero = m + 8 d, so
re-quantizing Q4_1 weights recovers their codes and loses nothing but the rounding of the
scales to the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.config import QUANTIZATION_METHODS

INT4_GROUP_SIZE = 32
# torch's CPU int4 kernel works on whole tiles of output rows and of input columns.
_INT4_ROW_MULTIPLE = 16
_INT4_MID = 8


@dataclass
class Int8Weight:
    """int8 codes [out, in] with one scale per output row: w = q * scale."""

    codes: torch.Tensor
    scales: torch.Tensor

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

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ w^T → [T, out] in x's dtype."""
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, self.group_size, self.scales_and_zeros
        )

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        return self.packed.nbytes + self.scales_and_zeros.nbytes


QuantizedWeight = Int8Weight | Int4Weight


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric int8 per output row (scale = max |w| / 127), scales in the weight's dtype."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
    codes = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    return Int8Weight(codes.contiguous(), scales.to(weight.dtype))


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
    groups = weight.float().view(rows, cols // group_size, group_size)
    low = groups.amin(dim=-1)
    scales = ((groups.amax(dim=-1) - low) / 15.0).clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15)
    zeros = low + _INT4_MID * scales
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        codes.view(rows, cols).to(torch.int32), 1
    )
    # The kernel wants [in / group, out, (scale, zero)] in the activation dtype.
    scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(weight.dtype)
    return Int4Weight(packed, scales_and_zeros.contiguous(), group_size)


def dequantize(weight: QuantizedWeight, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """The dense [out, in] weight a quantized weight stands for (for tests and checks)."""
    eye = torch.eye(in_features, dtype=dtype)
    return weight.matmul(eye).t().contiguous()


def quantize(weight: torch.Tensor, method: str) -> QuantizedWeight | None:
    """`weight` [out, in] in `method` ("int8" or "int4"); None when the shape does not fit."""
    if method == "int8":
        return quantize_int8(weight)
    if method == "int4":
        return quantize_int4(weight) if can_quantize_int4(weight) else None
    raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {method!r}.")
