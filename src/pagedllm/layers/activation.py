"""Activation functions applied to fused projections; no parameters, no state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers import cpu_ops


class SiluAndMul(nn.Module):
    """SwiGLU gate: [..., 2 * d] (gate | up) → silu(gate) * up of shape [..., d]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Split the fused gate_up output in halves and combine them."""
        if cpu_ops.serves(x):
            return cpu_ops.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)  # each [..., d]
        return F.silu(gate) * up
