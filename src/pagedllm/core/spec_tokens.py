"""Draft tokens in the scheduler: how many a request verifies, and what came of them.

Speculative decoding (spec_decode/) leaves each running request a few draft tokens after a
step. The scheduler schedules them after the request's real tokens, within the token
budget; the step's sampled tokens then say how many were accepted, and the rejected
positions are rolled back. This module holds that arithmetic and the acceptance counters.
It must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedllm.request import Request


def drafts_to_schedule(
    request: Request, num_new_tokens: int, token_budget: int, max_model_len: int
) -> list[int]:
    """The prefix of `request`'s drafts it verifies this step, after `num_new_tokens` real
    tokens: none unless those reach its last token, and no more than the budget left, the
    context length and its remaining `max_tokens` (after the one token every step emits)
    allow. A constrained request keeps the drafts its grammar allows.
    """
    drafts = request.spec_token_ids
    if not drafts:
        return []
    if request.num_computed_tokens + num_new_tokens < request.num_tokens:
        return []  # still prefilling
    room = min(
        token_budget - num_new_tokens,
        max_model_len - request.num_tokens,
        request.max_tokens - request.num_output_tokens - 1,
    )
    drafts = drafts[: max(0, room)]
    if drafts and request.structured_output is not None:
        drafts = drafts[: request.structured_output.num_valid_tokens(drafts)]
    return drafts


@dataclass
class SpecDecodeCounters:
    """Cumulative acceptance counters (vLLM's `spec_decode_*` metrics).

    Attributes:
        num_drafts: verification runs (requests with at least one draft, per step).
        num_draft_tokens: draft tokens verified.
        num_accepted_tokens: draft tokens accepted.
        accepted_per_pos: per draft position, how often it was accepted.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one verification: `num_accepted` of `num_draft_tokens` drafts accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft_tokens:
            self.accepted_per_pos.extend([0] * (num_draft_tokens - len(self.accepted_per_pos)))
        for position in range(num_accepted):
            self.accepted_per_pos[position] += 1
