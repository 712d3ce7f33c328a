"""RMSNorm with an optional fused residual add, statistics in float32 like HF.

Only normalisation lives here; where the residual stream starts and ends is the decoder
layer's business.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers import cpu_ops
from pagedllm.layers.linear import default_weight_loader


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) * weight, with the statistics taken in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]

    def _norm(self, x32: torch.Tensor) -> torch.Tensor:
        # As HF: normalise in float32, cast to the model dtype, then scale by the weight.
        normed = F.rms_norm(x32, (self.hidden_size,), eps=self.eps)
        return self.weight * normed.to(self.weight.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalise `x` (+ `residual` when given).

        Returns:
            (normalised output in the model dtype, new residual), where the new residual is
            x + residual (or x itself when no residual is given) in float32. Keeping the
            residual stream in float32 costs no extra op (the add promotes) and keeps
            bfloat16 runs closer to float32: it halves their logit divergence. On CPU in
            bfloat16 one fused C call does all of it and updates `residual` in place.
        """
        if cpu_ops.serves(x) and self.weight.dtype == torch.bfloat16 and (
            residual is None or residual.is_contiguous()
        ):
            return cpu_ops.add_rms_norm(x, residual, self.weight, self.eps)
        x32 = x.float() if residual is None else residual + x  # [..., hidden_size] float32
        return self._norm(x32), x32
