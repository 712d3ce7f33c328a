"""Activation functions applied to fused projections; no parameters, no state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers import cpu_ops


def apply_activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """silu, gelu_tanh (GPT-2's gelu_new, Gemma's gelu_pytorch_tanh), gelu (erf), relu or
    quick_gelu (CLIP's x * sigmoid(1.702 x))."""
    if name == "silu":
        return F.silu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    if name == "relu":
        return F.relu(x)
    if name == "quick_gelu":
        rows = x.reshape(-1, x.shape[-1]) if x.is_contiguous() else x
        if cpu_ops.serves(rows):  # bfloat16 on CPU: one fused pass, the same roundings
            return cpu_ops.quick_gelu(rows).view(x.shape)
        return x * torch.sigmoid(1.702 * x)
    raise ValueError(f"Unknown activation {name!r}.")


class SiluAndMul(nn.Module):
    """SwiGLU gate: [..., 2 * d] (gate | up) → silu(gate) * up of shape [..., d]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Split the fused gate_up output in halves and combine them."""
        if cpu_ops.serves(x):
            return cpu_ops.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)  # each [..., d]
        return F.silu(gate) * up


class ActivationAndMul(nn.Module):
    """A gated MLP's activation for any `activation` (GeGLU for Gemma's gelu_tanh):
    [..., 2 * d] (gate | up) → act(gate) * up."""

    def __init__(self, activation: str) -> None:
        super().__init__()
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Split the fused gate_up output in halves and combine them."""
        if self.activation == "gelu_tanh" and cpu_ops.serves(x):
            return cpu_ops.gelu_tanh_and_mul(x)
        gate, up = x.chunk(2, dim=-1)  # each [..., d]
        return apply_activation(self.activation, gate) * up


def gated_activation(activation: str) -> nn.Module:
    """The fused-op SiluAndMul for silu, ActivationAndMul otherwise."""
    return SiluAndMul() if activation == "silu" else ActivationAndMul(activation)


class Activation(nn.Module):
    """`apply_activation(name, x)` as a module (vision towers, projectors)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The activation, elementwise."""
        return apply_activation(self.name, x)
