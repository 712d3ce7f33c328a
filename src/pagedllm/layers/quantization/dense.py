"""The dense methods: torch's matmul on the layer's weight, or oneDNN's packed bf16 layout.

`DenseMethod` multiplies the layer's own weight Parameter (so a tied or shared weight stays
one tensor); `PackedDenseMethod` holds oneDNN's blocked copy of it, about 2x faster for
small batches on CPUs whose bf16 matmuls are native (the platform says where). A packed
matmul runs on a bounded set of row counts (`packed_rows`): oneDNN builds and caches a
kernel per input shape, and a serving load changes the step's token count nearly every
step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers.quantization.base import LinearMethod
from pagedllm.platform import get_platform
from pagedllm.utils.math import round_up


class DenseMethod(LinearMethod):
    """x @ W^T with the layer's weight as it was loaded (the exact reference path)."""

    is_dense = True

    def __init__(self, weight: nn.Parameter) -> None:
        self.weight = weight

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """torch's linear."""
        return F.linear(x, self.weight, bias)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight itself."""
        return self.weight.to(dtype)

    def nbytes(self) -> int:
        """The weight's bytes."""
        return self.weight.nbytes


class PackedDenseMethod(LinearMethod):
    """x @ W^T with W in oneDNN's packed bf16 layout (see the module docstring)."""

    is_dense = True

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = pack_weight_for_cpu(weight)
        self.shape = tuple(weight.shape)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """oneDNN's matmul on the packed weight."""
        return packed_linear(x, self.packed, bias)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The plain weight, read back through the matmul (an identity input)."""
        eye = torch.eye(self.shape[1], dtype=self.packed.dtype)
        return packed_linear(eye, self.packed, None).t().contiguous().to(dtype)

    def nbytes(self) -> int:
        """The packed copy's bytes."""
        return self.packed.nbytes


def can_pack_for_cpu(weight: torch.Tensor) -> bool:
    """True when oneDNN's packed bf16 layout pays for this weight (the platform's answer:
    bfloat16 where bf16 matmuls are native; elsewhere oneDNN refuses or emulates it)."""
    return get_platform(weight.device).packs_dense_weights(weight.dtype)


def dense_method(weight: nn.Parameter) -> LinearMethod:
    """The fastest dense method for `weight` here: packed where that pays, else plain."""
    return PackedDenseMethod(weight.data) if can_pack_for_cpu(weight) else DenseMethod(weight)


def pack_weight_for_cpu(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked layout of `weight` [out, in]: about 2x faster for small batches.

    The result has the same shape and dtype but a different memory order, so it is only
    valid as the weight argument of `packed_linear`.
    """
    # The batch-size hint only tunes the layout; any batch size works with it.
    return torch.ops.mkldnn._reorder_linear_weight(weight, 64)


def packed_rows(num_rows: int) -> int:
    """The row count a packed matmul of `num_rows` rows runs with (the rest are zero rows).

    oneDNN builds (JIT-compiles) and caches a kernel per input shape: about 3 ms and a few
    hundred KB each. Batch sizes that change every step would rebuild kernels every step,
    and the process grew by every new size seen (+28% resident memory in a 10-minute soak).
    Sizes are exact up to 16, then rounded up to a step of an eighth of the power of two
    below them (at least 16): 55 sizes up to 2048 rows, at most 12.5% extra rows past 128.
    """
    if num_rows <= 16:
        return num_rows
    return round_up(num_rows, max(16, 1 << (num_rows.bit_length() - 4)))


def packed_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ W^T + b with a weight from `pack_weight_for_cpu`; x [rows, ..., in] runs padded
    to `packed_rows(rows)` rows, each row's result the same as in an unpadded batch of that
    many rows."""
    rows = x.shape[0]
    padded = packed_rows(rows)
    if padded != rows:
        x = torch.cat((x, x.new_zeros(padded - rows, *x.shape[1:])))
    out = torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
    return out if padded == rows else out[:rows]
