"""Group-quantized weights for GPUs: a GGUF's int4 / int8 codes multiplied by the Triton
kernel (triton_kernels/group_matmul.py) with activations in the model's dtype (W4A16,
W8A16), so a 4-bit model reads 4-bit weights on the GPU instead of a dequantized copy.

A weight loaded as file codes (GroupCodes: Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, GPTQ/AWQ)
keeps them exactly: 4-bit codes packed two a byte as in the file, wider ones one a byte,
with the file's float32 scales and minimums. A dense weight asked to run int4 (or int8 /
fp8) is quantized to the same format (asymmetric int4 in groups of 32; symmetric int8 in
groups of 32). No dense copy is kept: the kernel serves every step size.

Where it runs: on CUDA when triton is installed; on CPU only with
PAGEDLLM_QUANTIZED_MATMUL=triton and TRITON_INTERPRET=1 (tests of the kernel's logic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.layers.quantization.base import QuantizedMethod
from pagedllm.layers.quantization.codes import (
    INT4_GROUP_SIZE,
    GroupCodes,
    fp8_grid,
    int4_group_codes,
)
from pagedllm.platform import get_platform

_INT8_LEVELS = 127.0


def uses_triton_weights(device: torch.device | str) -> bool:
    """Whether quantized layers on `device` take the Triton group format: on CUDA when
    triton is installed, elsewhere only when PAGEDLLM_QUANTIZED_MATMUL=triton asks (and
    Triton can run there: TRITON_INTERPRET on CPU)."""
    return get_platform(device).group_weights_on_triton()


@dataclass
class TritonGroupWeight(QuantizedMethod):
    """A weight as group codes for the Triton kernel: w = q * s (+ m) per group of 32.

    Attributes:
        codes: [out, in / 2] uint8 (4-bit, input j of a group in the low nibble of its
            byte j, input j + 16 in the high one) or [out, in] int8 (8-bit).
        scales: [out, in / 32] float32, or [out, in / 16] (a scale per half-group, Q6_K).
        mins: [out, in / 32] float32 minimums, or None.
        bits: 4 or 8.
        split_k: programs sharing each output tile's input groups (it follows the weight's
            shape only: set at the first matmul, then reused).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    bits: int
    split_k: int | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] @ w^T → [..., out] in x's dtype."""
        from pagedllm.triton_kernels.group_matmul import GROUP, group_matmul, split_k_for

        if self.split_k is None:
            self.split_k = split_k_for(self.codes.shape[0], x.shape[-1] // GROUP)
        rows = x.reshape(-1, x.shape[-1])
        out = group_matmul(rows, self.codes, self.scales, self.mins, self.bits, self.split_k)
        return out.view(*x.shape[:-1], out.shape[-1])

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight, computed in float32 from the codes."""
        rows = self.codes.shape[0]
        if self.bits == 4:
            packed = self.codes.view(rows, -1, 16)
            codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()  # [rows, g, 32]
        else:
            codes = self.codes.view(rows, -1, INT4_GROUP_SIZE).float()
        groups = codes.shape[1]
        scales = self.scales.view(rows, groups, -1)  # one or two per group
        values = (codes.view(rows, groups, scales.shape[-1], -1) * scales[..., None]).view(
            rows, groups, INT4_GROUP_SIZE
        )
        if self.mins is not None:
            values = values + self.mins[..., None]
        return values.view(rows, -1).to(dtype)

    def nbytes(self) -> int:
        """Bytes held by this weight."""
        mins = 0 if self.mins is None else self.mins.nbytes
        return self.codes.nbytes + self.scales.nbytes + mins


def triton_weight_from_codes(codes: GroupCodes, device: torch.device) -> TritonGroupWeight:
    """File codes as a TritonGroupWeight on `device`, exactly (codes, scales and minimums
    kept): 4-bit codes packed, wider ones (Q5_K's 0..31, int8 formats) a byte each."""
    rows = codes.codes.shape[0]
    mins = None if codes.mins is None else codes.mins.float().contiguous().to(device)
    scales = codes.scales.float().reshape(rows, -1).contiguous().to(device)
    if codes.is_int4 and int(codes.codes.max()) <= 15:
        nibbles = codes.codes.to(torch.uint8)
        packed = nibbles[..., :16] | (nibbles[..., 16:] << 4)  # [rows, groups, 16]
        return TritonGroupWeight(packed.reshape(rows, -1).contiguous().to(device), scales,
                                 mins, bits=4)
    stored = codes.codes.to(torch.int8).reshape(rows, -1).contiguous().to(device)
    return TritonGroupWeight(stored, scales, mins, bits=8)


def quantize_for_triton(weight: torch.Tensor, method: str) -> TritonGroupWeight:
    """A dense [out, in] weight in `method`'s group format: "int4" asymmetric in groups of
    32 (min/max codes), "int8" symmetric in groups of 32, "fp8" the weight rounded to
    float8 e4m3 (one scale per tensor), then int8.

    Raises:
        ValueError: when the input size is not a multiple of 32.
    """
    rows, cols = weight.shape
    if cols % INT4_GROUP_SIZE:
        raise ValueError(
            f"quantization={method!r} on the GPU needs input sizes that are multiples of "
            f"{INT4_GROUP_SIZE}; a layer has {cols}."
        )
    if method == "int4":
        codes, scales, mins = int4_group_codes(weight, INT4_GROUP_SIZE)
        return triton_weight_from_codes(
            GroupCodes(codes.to(torch.uint8).cpu(), scales.cpu(), mins.cpu()), weight.device
        )
    source = fp8_grid(weight) if method == "fp8" else weight
    groups = source.float().view(rows, cols // INT4_GROUP_SIZE, INT4_GROUP_SIZE)
    scales = (groups.abs().amax(dim=-1) / _INT8_LEVELS).clamp(min=torch.finfo(torch.float32).tiny)
    codes = (groups / scales[..., None]).round().clamp(-_INT8_LEVELS, _INT8_LEVELS)
    return TritonGroupWeight(
        codes.to(torch.int8).view(rows, cols).contiguous(), scales.contiguous(), None, bits=8
    )
