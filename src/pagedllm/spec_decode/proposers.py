"""The proposer the model runner asks for draft tokens, chosen by `speculative_config.method`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.ngram_proposer import NgramProposer


class Proposer(Protocol):
    """Proposes draft tokens for requests that just sampled."""

    def propose(
        self, request_ids: Sequence[str], token_ids: Sequence[Sequence[int]]
    ) -> list[list[int]]:
        """Per request, its drafts (possibly none), from its tokens so far."""
        ...

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop the state of finished or preempted requests."""
        ...


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer of `config.method`."""
    if config.method == "ngram":
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        return NgramProposer(
            config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max
        )
    raise ValueError(f"speculative_config method {config.method!r} is not built yet.")
