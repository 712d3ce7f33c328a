"""The interfaces of `models/`: every causal LM, and one that also reads images."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from pagedllm.layers.embedding import GreedyTail


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
        ranking_only=True).argmax(-1)` would pick it, without materializing float32 logits;
        -1 for a row holding a NaN or infinity (the sampler fails its request)."""
        ...

    def greedy_tail(self, hidden_states: torch.Tensor) -> GreedyTail | None:
        """`compute_greedy_tokens`' C call's inputs for rows like `hidden_states`, for a
        caller that makes the call itself (csrc/decode_loop.c); None where it is not one
        C call."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named weights; return the names of the parameters that were filled."""
        ...


@dataclass
class MultiModalEmbeddings:
    """Encoder outputs placed in a step's flattened batch: the rows of the tokens they
    replace (image placeholders) and their embeddings.

    Attributes:
        rows: [K] int64 indices into the step's tokens.
        values: [K, hidden] the embeddings (the model's dtype).
    """

    rows: torch.Tensor
    values: torch.Tensor


class SupportsMultiModal(Protocol):
    """A causal LM that also reads images (or video) through a vision encoder.

    The runner encodes each item once (`encode`), caches the output by the item's hash, and
    passes the rows a step needs to `forward(..., mm_embeds=...)`, which puts them in place
    of the placeholder tokens' text embeddings.
    """

    supports_multimodal: bool

    def encode(
        self, modality: str, items: list[dict[str, torch.Tensor]]
    ) -> list[torch.Tensor]:
        """Each item's encoder inputs → its embeddings [num_embeds, hidden]."""
        ...
