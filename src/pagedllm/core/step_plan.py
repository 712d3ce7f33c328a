"""StepPlan: what one `Scheduler.schedule()` call has decided so far (scheduler-internal).

A mutable scratch record, filled by the scheduling phases and packaged into a
`SchedulerOutput` at the end of the step. It never changes blocks or requests' state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pagedllm.core.kv_cache_manager import BlockIds
from pagedllm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedllm.request import Request


def is_prefill(request: Request, start: int) -> bool:
    """True when `request`, computed up to `start`, has more than its next token left: a
    prompt (or a recomputed context) rather than a decode."""
    return request.num_tokens - start > 1


@dataclass
class StepPlan:
    """What one `schedule()` call has decided so far."""

    token_budget: int
    # Tokens the step's prefill chunks may still take (None: only token_budget bounds
    # them): SchedulerConfig.prefill_tokens_per_decode, set when decodes run.
    prefill_budget: int | None = None
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    new_requests: list[Request] = field(default_factory=list)
    cached_requests: list[Request] = field(default_factory=list)
    new_block_ids: dict[str, BlockIds] = field(default_factory=dict)
    # Preempted while scheduling running requests: the cache is tight, admit nobody.
    num_preempted_running: int = 0
    # Every request preempted this step (also by a higher-priority waiting one).
    preempted_ids: set[str] = field(default_factory=set)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Draft tokens verified this step, by request (their count is in num_scheduled_tokens).
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # The LoRA adapters (lora_int_id) the step's requests use.
    lora_ids: set[int] = field(default_factory=set)
    # Decode steps the runner takes (core/multi_step.py); the running requests' blocks
    # hold the slots of the steps after the first.
    num_steps: int = 1

    def add(
        self,
        request: Request,
        num_tokens: int,
        block_ids: BlockIds,
        is_new: bool,
        spec_token_ids: list[int] | None = None,
    ) -> None:
        """Record that `request` computes `num_tokens` tokens this step (the last ones
        being `spec_token_ids`, drafts to verify, if any)."""
        assert 0 < num_tokens <= self.token_budget
        if (self.prefill_budget is not None and not request.is_pooling
                and is_prefill(request, request.num_computed_tokens)):
            # A pooling input runs whole past the cap and leaves it to the chunks.
            self.prefill_budget = max(0, self.prefill_budget - num_tokens)
        self.num_scheduled_tokens[request.request_id] = num_tokens
        if request.lora_request is not None:
            self.lora_ids.add(request.lora_request.lora_int_id)
        if spec_token_ids:
            self.spec_token_ids[request.request_id] = spec_token_ids
        self.token_budget -= num_tokens
        self.new_block_ids[request.request_id] = block_ids
        (self.new_requests if is_new else self.cached_requests).append(request)

    def runs_decodes_only(self) -> bool:
        """True when the step only continues running requests, one token each (what the
        runner's extra steps of a multi-step need: admissions make it one step)."""
        return bool(self.cached_requests) and not self.new_requests and all(
            count == 1 for count in self.num_scheduled_tokens.values()
        )

    def budget_for(self, request: Request, start: int, whole: bool = False) -> int:
        """Tokens `request` may compute from `start` this step: the step's budget, and
        for a prefill chunk also the prefill cap (never for a prompt that must run
        `whole`, which a cap would hold back for as long as decodes run)."""
        if self.prefill_budget is None or whole or not is_prefill(request, start):
            return self.token_budget
        return min(self.token_budget, self.prefill_budget)

    def _new_token_ids(self, request: Request) -> list[int]:
        """The output tokens among those `request` computes this step."""
        start = request.num_computed_tokens
        end = start + self.num_scheduled_tokens[request.request_id]
        return request.all_token_ids[max(start, request.num_prompt_tokens) : end]

    def make_output(
        self,
        get_block_ids: Callable[[str], BlockIds],
        finished_request_ids: set[str],
        trimmed_tables: dict[str, int] | None = None,
        send_token_ids: bool = False,
    ) -> SchedulerOutput:
        """The worker's view of the plan: new requests in full, the others as diffs.

        Args:
            get_block_ids: request id → its whole block tables (one per KV cache group).
            finished_request_ids: requests the worker must drop before this step.
            trimmed_tables: request id → its table length since blocks of rejected drafts
                were freed, for requests the worker has not been told yet (consumed here
                for every request sent).
            send_token_ids: fill `CachedRequestData.new_token_ids` (several ranks: the
                workers do not keep what the one sampling rank sampled).
        """
        trimmed = trimmed_tables if trimmed_tables is not None else {}
        new_reqs = [
            NewRequestData(
                request_id=request.request_id,
                data=request.data,
                output_token_ids=list(request.output_token_ids),
                block_ids=get_block_ids(request.request_id),
                num_computed_tokens=request.num_computed_tokens,
            )
            for request in self.new_requests
        ]
        cached = self.cached_requests
        cached_reqs = CachedRequestData(
            request_ids=[request.request_id for request in cached],
            new_block_ids=[self.new_block_ids[request.request_id] for request in cached],
            num_computed_tokens=[request.num_computed_tokens for request in cached],
            num_blocks_kept=[trimmed.pop(request.request_id, None) for request in cached],
            new_token_ids=[self._new_token_ids(request) for request in cached]
            if send_token_ids else [],
        )
        for request in self.new_requests:  # sent in full: nothing left to cut
            trimmed.pop(request.request_id, None)
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=self.num_scheduled_tokens,
            total_num_scheduled_tokens=sum(self.num_scheduled_tokens.values()),
            finished_request_ids=finished_request_ids,
            blocks_to_swap_out=self.blocks_to_swap_out,
            blocks_to_swap_in=self.blocks_to_swap_in,
            scheduled_spec_decode_tokens=self.spec_token_ids,
        )
