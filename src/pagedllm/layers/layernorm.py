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
        # The fused call updates a float32 residual in place: any other one takes the torch
        # path (a bfloat16 residual would be overrun).
        if cpu_ops.serves(x) and self.weight.dtype == torch.bfloat16 and (
            residual is None or (residual.is_contiguous() and residual.dtype == torch.float32)
        ):
            return cpu_ops.add_rms_norm(x, residual, self.weight, self.eps)
        x32 = x.float() if residual is None else residual.float() + x  # [..., hidden] float32
        return self._norm(x32), x32


def _load_one_plus(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Store 1 + w (computed in float32, as Gemma's forward does) for a (1 + w) norm."""
    default_weight_loader(param, loaded_weight.float() + 1.0)


class OnePlusRMSNorm(RMSNorm):
    """Gemma's RMSNorm: y = norm(x) * (1 + w). The checkpoint's w is stored as 1 + w when
    loaded, so the forward (and the fused C path) is RMSNorm's own."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.weight.weight_loader = _load_one_plus  # type: ignore[attr-defined]


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, with RMSNorm's residual protocol
    (GPT-2, OPT): statistics in float32, the residual stream kept in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
            self.bias.weight_loader = default_weight_loader  # type: ignore[attr-defined]

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(layer_norm(x + residual) in the model dtype, x + residual in float32). On CPU in
        bfloat16 one fused C call does it (as RMSNorm's), updating `residual` in place."""
        bias_ok = self.bias is None or self.bias.dtype == torch.bfloat16
        if cpu_ops.serves(x) and self.weight.dtype == torch.bfloat16 and bias_ok and (
            residual is None or (residual.is_contiguous() and residual.dtype == torch.float32)
        ):
            return cpu_ops.add_layer_norm(x, residual, self.weight, self.bias, self.eps)
        x32 = x.float() if residual is None else residual + x
        bias = None if self.bias is None else self.bias.float()
        normed = F.layer_norm(x32, (self.hidden_size,), self.weight.float(), bias, self.eps)
        return normed.to(self.weight.dtype), x32


def make_norm(kind: str, hidden_size: int, eps: float, bias: bool = False) -> nn.Module:
    """The norm named by a DecoderSpec: "rms", "rms_one_plus" (Gemma) or "layer"."""
    if kind == "rms":
        return RMSNorm(hidden_size, eps)
    if kind == "rms_one_plus":
        return OnePlusRMSNorm(hidden_size, eps)
    if kind == "layer":
        return LayerNorm(hidden_size, eps, bias)
    raise ValueError(f"Unknown norm kind {kind!r}.")
