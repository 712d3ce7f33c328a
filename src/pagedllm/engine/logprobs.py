"""Frontend side of logprobs: LogprobsLists from the core → vLLM-style `Logprob` dicts.

Each position becomes `{token_id: Logprob(logprob, rank, decoded_token)}` with the scored
token (sampled, or the actual prompt token) first, then the top-k. `decoded_token` is the
token decoded on its own, as vLLM does; decodes are cached per token id.

Must not: compute logprobs (the worker does) or keep per-request state.
"""

from __future__ import annotations

from typing import Any

from pagedllm.outputs import Logprob, LogprobsDict
from pagedllm.worker.outputs import LogprobsLists


class LogprobsBuilder:
    """Turns wire logprobs into user-facing dicts for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._decoded: dict[int, str] = {}

    def decode_token(self, token_id: int) -> str:
        """The text of one token decoded alone (cached)."""
        text = self._decoded.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) if self.tokenizer is not None else ""
            self._decoded[token_id] = text
        return text

    def to_dicts(self, lists: LogprobsLists) -> list[LogprobsDict]:
        """One dict per position of `lists`."""
        dicts = []
        for position, (token_ids, logprobs, rank) in enumerate(zip(
            lists.token_ids, lists.logprobs, lists.ranks, strict=True
        )):
            entry: LogprobsDict = {}
            others = (lists.other_ranks[position] if lists.other_ranks
                      else range(1, len(token_ids)))  # the top-k: ranks by position
            ranks = [rank, *others]
            for token_id, logprob, token_rank in zip(token_ids, logprobs, ranks, strict=True):
                # The scored token keeps its own entry when it is also among the top-k.
                if token_id not in entry:
                    entry[token_id] = Logprob(logprob, token_rank, self.decode_token(token_id))
            dicts.append(entry)
        return dicts


def sum_scored_logprobs(lists: LogprobsLists) -> float:
    """Sum of the scored tokens' logprobs (the first entry of each position)."""
    return sum(logprobs[0] for logprobs in lists.logprobs)
