"""What the rest of the engine asks of a grammar backend (xgrammar, llguidance).

A backend compiles a request's constraint (StructuredOutputsParams) for the model's
tokenizer into an immutable compiled grammar (shared by every request with the same
constraint), and makes a matcher per request from it. The matcher is the request's state:
it accepts the sampled tokens one step at a time, can roll back, fills the request's row of
the token bitmask (bit j of int32 word i allows token 32 i + j) and says when the grammar is
complete.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from pagedllm.sampling_params import StructuredOutputsParams


class GrammarMatcher(Protocol):
    """One request's position in its grammar."""

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over `token_ids`; False (and no advance past the bad one) if one is not
        allowed."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        ...

    def num_valid_tokens(self, token_ids: list[int]) -> int:
        """How many leading `token_ids` the grammar allows; the state is unchanged."""
        ...

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]`."""
        ...

    def is_terminated(self) -> bool:
        """True once the grammar is complete and a stop token was accepted."""
        ...


class GrammarBackend(Protocol):
    """Compiles constraints for one tokenizer and makes matchers."""

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of `params` (slow: run off the step loop).

        Raises:
            ValueError: naming the field, when the constraint is malformed.
        """
        ...

    def matcher(self, compiled: Any, stop_token_ids: list[int]) -> GrammarMatcher:
        """A fresh matcher; `stop_token_ids` end the request once the grammar is complete."""
        ...

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """A [num_rows, ceil(vocab / 32)] int32 bitmask."""
        ...
