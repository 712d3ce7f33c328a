"""Feed-forward blocks of a decoder layer: the gated MLP (SwiGLU / GeGLU) and the plain one
(GPT-2, OPT). Built from the fused linears; nothing here knows about attention."""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.distributed.parallel_state import GroupCoordinator
from pagedllm.layers import cpu_ops
from pagedllm.layers.activation import apply_activation, gated_activation
from pagedllm.layers.linear import Linear
from pagedllm.layers.parallel_linear import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool = False,
        activation: str = "silu", tp_group: GroupCoordinator | None = None,
        reduce_results: bool = True,
    ) -> None:
        super().__init__()
        # Split over the tensor-parallel group (the plain layers when it is one rank); without
        # `reduce_results` the output is this rank's partial sum (MoE experts reduce once).
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias, tp_group=tp_group
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias, tp_group=tp_group,
            reduce_results=reduce_results,
        )
        self.act_fn = gated_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] → [T, hidden]."""
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # via [T, 2 * intermediate]


class PlainMLP(nn.Module):
    """fc2(act(fc1(x))): GPT-2's c_fc / c_proj and OPT's fc1 / fc2, with biases."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool, activation: str
    ) -> None:
        super().__init__()
        self.fc1 = Linear(hidden_size, intermediate_size, bias)
        self.fc2 = Linear(intermediate_size, hidden_size, bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] → [T, hidden]."""
        hidden = self.fc1(x)
        if self.activation in cpu_ops.PLAIN_ACTIVATIONS and cpu_ops.serves(hidden):
            return self.fc2(cpu_ops.activation(self.activation, hidden))  # one C call
        return self.fc2(apply_activation(self.activation, hidden))
