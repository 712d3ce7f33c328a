"""The scheduler → worker contract: what to run this step, as plain data.

New requests are sent in full once; requests the worker already knows are sent as a diff
(new block ids, how many tokens to compute). The worker keeps its own copy of each request's
token ids and appends what it samples, so output tokens never travel back down.

Swap preemption adds two copy lists, applied by the worker before the forward pass, in this
order: `blocks_to_swap_out` (device → host), then `blocks_to_swap_in` (host → device). The
scheduler never swaps in during a step that swaps out, so the two never touch the same
block. A swapped-in request is sent as a `NewRequestData` with its new block table and its
computed token count: the worker rebuilds its state without recomputing anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedllm.request import RequestData


@dataclass
class NewRequestData:
    """A request the worker has not seen (or must rebuild after preemption).

    Attributes:
        request_id: id.
        data: what it carries from the API (request.py RequestData: its prompt, sampling
            parameters, ...), by reference.
        output_token_ids: tokens already generated (non-empty when resumed after preemption).
        block_ids: the request's whole block tables, one per KV cache group (0 where a
            sliding window let a block go).
        num_computed_tokens: tokens already in the KV cache before this step.
    """

    request_id: str
    data: RequestData
    output_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """Diffs for requests the worker already holds, one entry per request (parallel lists).

    Attributes:
        request_ids: ids.
        new_block_ids: per request, the blocks appended to each group's table this step.
        num_computed_tokens: tokens in the KV cache before this step.
        num_blocks_kept: per request, None, or the length every block table is cut to
            before the new blocks are appended (after a speculative step the scheduler
            freed the blocks that held only rejected draft tokens).
        new_token_ids: per request, the output tokens among those it computes this step
            (positions from max(num_computed_tokens, prompt length) on), when the workers
            do not keep what they sample (several ranks: only one samples); empty lists
            otherwise (a single worker appends its own samples).
    """

    request_ids: list[str] = field(default_factory=list)
    new_block_ids: list[tuple[list[int], ...]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_blocks_kept: list[int | None] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        """How many cached requests are scheduled."""
        return len(self.request_ids)


@dataclass
class SchedulerOutput:
    """Everything the worker needs for one step.

    Attributes:
        scheduled_new_reqs: requests sent in full.
        scheduled_cached_reqs: diffs for known requests.
        num_scheduled_tokens: request id → tokens to compute this step.
        total_num_scheduled_tokens: sum of the above.
        finished_request_ids: requests that ended (or were preempted) since the last step;
            the worker drops their state.
        blocks_to_swap_out: (device block id, host block id) pairs to copy device → host.
        blocks_to_swap_in: (device block id, host block id) pairs to copy host → device.
        structured_output_request_ids: requests that sample this step under a grammar, in
            the order of `grammar_bitmask`'s rows.
        grammar_bitmask: [rows, ceil(vocab / 32)] int32 tensor of the tokens each may sample
            (filled by the engine core), or None: one row per request in the order of
            structured_output_request_ids, or 1 + its drafts' count for a request that
            verifies drafts (the row of each verified position).
        scheduled_spec_decode_tokens: request id -> the draft tokens it verifies this step
            (speculative decoding); they are the last tokens of its scheduled count.
        scheduled_encoder_inputs: request id -> indices of its multimodal items the
            runner encodes this step (their outputs join the encoder cache).
        free_encoder_mm_hashes: encoder cache entries the runner drops before this step.
        num_steps: decode steps the runner takes (multi-step scheduling, core/multi_step.py):
            after the scheduled one, each request decodes the token it just sampled,
            into the lookahead slots its blocks already hold, and returns every token.
    """

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_request_ids: set[str]
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: Any = None
    # The KV connector's plan for the workers this step (loads, saves); None: none.
    kv_connector_metadata: Any = None
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    free_encoder_mm_hashes: list[str] = field(default_factory=list)
    num_steps: int = 1

    @property
    def is_empty(self) -> bool:
        """True when nothing is to be computed this step."""
        return self.total_num_scheduled_tokens == 0
