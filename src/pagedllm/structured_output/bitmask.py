"""Applying a step's grammar bitmask to the logits: the model runner's one call.

Bit j of int32 word i of a row allows token 32 i + j (the layout of xgrammar and
llguidance). Every constrained row is masked in one vectorised op; other rows are untouched.
"""

from __future__ import annotations

import torch

_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, ceil(V / 32)] int32 bitmask → [R, vocab_size] bool (True: allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _BIT_SHIFTS.to(bitmask.device)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set to -inf, in place, the logits of tokens the grammar forbids: `bitmask[i]` is for
    logits row `rows[i]`."""
    if not rows:
        return
    index = torch.tensor(rows, device=logits.device)
    allowed = allowed_tokens(bitmask.to(logits.device), logits.shape[-1])
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
