"""Post-step processors: what happens to each request when a step's tokens come back.

The scheduler's `update_from_output` hands every request that sampled to its processors,
in order: first each one's `before_append` (speculative decoding rolls back the positions
of rejected drafts and frees their blocks; lookahead slots are given back), then the
tokens are appended one at a time, each through every processor's `after_token` (the stop
checks: EOS, stop token ids, lengths; a grammar advances its matcher), until the request
finishes. The scheduler builds the list from its configs; a new per-request rule is a new
processor, not a branch in the update loop.
"""

from __future__ import annotations

from collections.abc import Callable

from pagedllm.core.spec_tokens import SpecDecodeCounters
from pagedllm.core.stop_check import check_stop
from pagedllm.logger import init_logger
from pagedllm.request import Request, RequestStatus

logger = init_logger(__name__)


class PostStepProcessor:
    """One per-request rule applied to a step's tokens; both places are optional."""

    def before_append(self, request: Request, token_ids: list[int], num_drafts: int) -> None:
        """Before the tokens are appended: `token_ids` were emitted by a row that verified
        `num_drafts` drafts (its accepted drafts, then one)."""

    def after_token(self, request: Request, token_id: int) -> None:
        """`token_id` was just appended; set a finished status if it ends the request."""


class DraftRollback(PostStepProcessor):
    """Un-compute the positions of rejected drafts and free the blocks that held only them;
    their KV is overwritten when real tokens reach those positions."""

    def __init__(self, counters: SpecDecodeCounters, trim: Callable[[Request], None]) -> None:
        self.counters = counters
        self.trim = trim

    def before_append(self, request: Request, token_ids: list[int], num_drafts: int) -> None:
        """Count the verification; roll back what was rejected."""
        if not num_drafts:
            return
        num_accepted = len(token_ids) - 1
        self.counters.observe(num_drafts, num_accepted)
        num_rejected = num_drafts - num_accepted
        if num_rejected:
            request.num_computed_tokens -= num_rejected
            self.trim(request)


class LookaheadRelease(PostStepProcessor):
    """The lookahead slots the step took go back: a drafter's KV's, or those of a
    multi-step's steps it did not run (core/multi_step.py)."""

    def __init__(self, trim: Callable[[Request], None]) -> None:
        self.trim = trim

    def before_append(self, request: Request, token_ids: list[int], num_drafts: int) -> None:
        """Free the blocks past the request's computed tokens."""
        self.trim(request)


class StopCheck(PostStepProcessor):
    """EOS (after min_tokens, unless ignore_eos), stop token ids, max_tokens, max_model_len."""

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len

    def after_token(self, request: Request, token_id: int) -> None:
        """core/stop_check.py's rules."""
        check_stop(request, token_id, self.max_model_len)


class GrammarAdvance(PostStepProcessor):
    """A constrained request's matcher takes every token; a grammar that completes ends the
    request at that token, and a token it refuses stops it."""

    def after_token(self, request: Request, token_id: int) -> None:
        """Advance the matcher (requests without a grammar are left alone)."""
        grammar = request.structured_output
        if grammar is None:
            return
        if not grammar.accept_tokens([token_id]):
            # Only a token outside the bitmask gets here: when other masks (min_tokens,
            # allowed_token_ids, bad_words) left no allowed token. End it rather than let
            # it run on unconstrained.
            logger.error(
                "Request %s sampled a token its grammar does not allow; stopping it.",
                request.request_id,
            )
            if not request.is_finished():
                request.status = RequestStatus.FINISHED_STOPPED
        elif grammar.is_terminated() and not request.is_finished():
            request.status = RequestStatus.FINISHED_STOPPED


def apply_processors(
    processors: list[PostStepProcessor], request: Request, token_ids: list[int], num_drafts: int
) -> list[int]:
    """Run `processors` over a request's step: returns the tokens appended (a prefix of
    `token_ids`, cut after the one that finished it)."""
    for processor in processors:
        processor.before_append(request, token_ids, num_drafts)
    assert request.num_computed_tokens == request.num_tokens + len(token_ids) - 1, (
        f"request {request.request_id} sampled before its prompt was computed"
    )
    appended: list[int] = []
    for token_id in token_ids:
        request.append_output_token_ids([token_id])
        appended.append(token_id)
        for processor in processors:
            processor.after_token(request, token_id)
        if request.is_finished():
            break
    return appended
