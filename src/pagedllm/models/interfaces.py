"""The interface every causal LM in `models/` implements."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch


class CausalLM(Protocol):
    """A decoder-only language model over the paged KV cache.

    Built as `Model(hf_config)`; the loader moves it to the device and dtype and streams the
    checkpoint's (HF-named) weights through `load_weights`.
    """

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[num_tokens] ids and positions → [num_tokens, hidden_size] hidden states."""
        ...

    def compute_logits(
        self, hidden_states: torch.Tensor, ranking_only: bool = False
    ) -> torch.Tensor:
        """[n, hidden_size] → [n, vocab_size] logits (only for positions to sample).

        With `ranking_only` the caller takes only each row's argmax: a model may then
        compute the logits outside the top few approximately (never their order at the top).
        """
        ...

    def compute_greedy_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[n, hidden_size] → [n] int64: each row's argmax token, as `compute_logits(...,
        ranking_only=True).argmax(-1)` would pick it, without materializing float32 logits."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named weights; return the names of the parameters that were filled."""
        ...
