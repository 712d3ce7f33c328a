"""Which rows of a step's hidden states hold a NaN or infinity (a numerical fault that stays
in its request: worker/nonfinite.py fails those requests alone)."""

from __future__ import annotations

import torch

from pagedllm.layers import cpu_ops


def finite_rows(values: torch.Tensor) -> torch.Tensor:
    """[rows] bool: which rows of [rows, d] `values` hold no NaN or infinity (no host sync:
    a caller about to copy its tokens to the host reads this after them)."""
    if cpu_ops.serves(values):  # bfloat16 on the host: one C pass
        return cpu_ops.finite_rows(values)
    return torch.isfinite(values).all(dim=-1)


def mark_nonfinite_rows(tokens: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """`tokens` [N], changed in place: -1 where the row of `hidden_states` is not finite."""
    return tokens.masked_fill_(~finite_rows(hidden_states), -1)
