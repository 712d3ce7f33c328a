"""LinearMethod: how one linear layer's weight is stored and multiplied.

vLLM's quantization methods in our shape, in three stages. Every layer loads through the
same parameters (`create_weights`: the dense weight and bias, a checkpoint's group codes
kept aside by the layer's loader). Once loading ends, the layer's
`process_weights_after_loading` has selection.py choose one method from the format it was
asked to run, what the checkpoint stored and what its platform runs, and build it from the
loaded weight. From then on every step is one `apply`. The methods:

- dense.py: `DenseMethod` (torch's matmul on the dense weight), `PackedDenseMethod`
  (oneDNN's packed bf16 layout);
- bf16_panels.py: `Bf16PanelWeight` (dense bf16 weights on our C kernel);
- byte_dot.py: `W4A8Weight`, `W8A8Weight` (our C kernels), `SplitWeight` (a format no one
  layout holds, as the sum of two);
- weight_only.py: `Int8Weight`, `Int4Weight` (torch's weight-only kernels);
- triton_groups.py: `TritonGroupWeight` (GPU);
- crossover.py: `CrossoverMethod`, two methods and the step size from which the second
  serves (dense weights beside quantized ones where they win large steps);
- `ReorderedInput` below: a method whose codes read the input in another order (GPTQ
  act-order).

A method never sees the scheduler, the batch or the model; it is chosen once, at load.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn


class LinearMethod(ABC):
    """One weight format on one platform: create, process after loading, apply."""

    # True when steps multiply the layer's own dense weight (exact in its dtype).
    is_dense = False

    @staticmethod
    def create_weights(layer: nn.Module, input_size: int, output_size: int, bias: bool) -> None:
        """Register the parameters a checkpoint loads into: every format loads through the
        dense weight [out, in] and the bias (group codes go aside through the layer's
        `weight_loader`), so this is the same for every method."""
        layer.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        if bias:
            layer.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
        else:
            layer.register_parameter("bias", None)

    @abstractmethod
    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] @ W^T (+ bias) → [T, out]."""

    @abstractmethod
    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight this method multiplies by (for tests and refinements)."""

    @abstractmethod
    def nbytes(self) -> int:
        """Bytes this method holds."""

    def quantized_part(self) -> LinearMethod | None:
        """The quantized weight this method runs (itself for a code format; the quantized
        side of a crossover), None for dense weights."""
        return None if self.is_dense else self

    def holds_dense_weight(self) -> bool:
        """Whether some steps multiply a dense copy of the weight."""
        return self.is_dense

    def base_method(self) -> LinearMethod:
        """The method without what wraps it to add to its output (LoRA slots)."""
        return self

    def input_order(self) -> torch.Tensor | None:
        """The order its codes read the inputs in (None: the layer's own)."""
        return None


class QuantizedMethod(LinearMethod):
    """A code format: `matmul` multiplies without the bias; `apply` adds it."""

    @abstractmethod
    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ W^T → [T, out]."""

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ W^T, plus the bias (kept in the model's dtype beside the codes)."""
        out = self.matmul(x)
        return out if bias is None else out + bias


@dataclass
class ReorderedInput(LinearMethod):
    """A method whose codes read the inputs in `input_perm`'s order (GPTQ act-order: code
    column j multiplies input input_perm[j]): one index_select, then the method."""

    inner: LinearMethod
    input_perm: torch.Tensor  # [in] int64

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The inner method on x's columns in the codes' order."""
        return self.inner.apply(x.index_select(-1, self.input_perm), bias)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in the layer's own input order."""
        permuted = self.inner.dense(dtype)
        ordered = torch.empty_like(permuted)
        ordered[:, self.input_perm] = permuted
        return ordered

    def nbytes(self) -> int:
        """The inner method's bytes and the permutation's."""
        return self.inner.nbytes() + self.input_perm.nbytes

    def quantized_part(self) -> LinearMethod | None:
        """The inner method's."""
        return self.inner.quantized_part()

    def holds_dense_weight(self) -> bool:
        """The inner method's answer."""
        return self.inner.holds_dense_weight()

    def input_order(self) -> torch.Tensor | None:
        """`input_perm`."""
        return self.input_perm
