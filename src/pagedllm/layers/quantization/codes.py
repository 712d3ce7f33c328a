"""Group codes: a weight as a quantized checkpoint stores it (GGUF, GPTQ, AWQ, compressed-
tensors), handed by the loader to the layers instead of a dense tensor, and the arithmetic
shared by the formats that hold such codes (groups of 32, FP8's grid)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

INT4_GROUP_SIZE = 32

FP8_MAX = 448.0  # the largest float8 e4m3 value


def int4_group_codes(
    weight: torch.Tensor, group_size: int, half: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [out, groups, group_size] in 0..15, scales d, minimums m), w = d * q + m.

    With `half`, d and m are first rounded to float16 (as GGUF's Q4_1 stores them: 0.625
    bytes a weight where float32 needs 0.75) and the codes are taken against the rounded
    values, so d * q + m is what a float16 reader computes; where some d or m does not fit
    a float16 they stay float32."""
    rows, cols = weight.shape
    groups = weight.float().view(rows, cols // group_size, group_size)
    low = groups.amin(dim=-1)
    scales = (groups.amax(dim=-1) - low) / 15.0
    if half:
        low_half, scales_half = low.half().float(), scales.half().float()
        if bool(torch.isfinite(low_half).all() and torch.isfinite(scales_half).all()):
            low, scales = low_half, scales_half
    # A constant group (or one whose range rounds to a zero scale) takes code 0 (w = m).
    step = scales.clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((groups - low[..., None]) / step[..., None]).round().clamp(0, 15)
    codes = torch.where(scales[..., None] > 0, codes, torch.zeros_like(codes))
    return codes, scales, low


def fp8_grid(weight: torch.Tensor) -> torch.Tensor:
    """`weight` rounded to float8 e4m3 with one scale per tensor (vLLM's dynamic "fp8"
    weights: scale = max |w| / 448), in `weight`'s dtype."""
    scale = (weight.abs().amax().float() / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    codes = (weight.float() / scale).to(torch.float8_e4m3fn)
    return (codes.float() * scale).to(weight.dtype)


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

