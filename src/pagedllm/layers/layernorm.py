"""RMSNorm with an optional fused residual add, computed in float32 like HF.

Only normalisation lives here; where the residual stream starts and ends is the decoder
layer's business.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.layers.linear import default_weight_loader


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) * weight, with the statistics taken in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Same rounding points as HF: normalise in float32, cast back, then scale by weight.
        x32 = x.float()
        variance = x32.pow(2).mean(dim=-1, keepdim=True)  # [..., 1]
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalise `x` (+ `residual` when given).

        Returns:
            (normalised output, new residual), where the new residual is x + residual
            (or x itself when no residual is given), in the input dtype.
        """
        if residual is not None:
            x = x + residual  # [..., hidden_size], in the model dtype as HF does
        return self._norm(x), x
