"""Scheduler: decides, each step, which requests run and how many tokens each computes.

One token-budget loop in the style of vLLM v1: running requests first (decodes and the rest
of chunked prompts), then waiting ones in queue order, within `max_num_batched_tokens` and
`max_num_seqs`. When KV blocks run out it preempts the newest running request by recompute.
After the worker runs, `update_from_output` appends sampled tokens and applies the stop
checks that need only token ids (EOS, stop token ids, lengths); stop strings live in the
frontend, which aborts the request. The scheduler reaches KV blocks only through
`KVCacheManager` and never imports torch, the worker or the engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedllm.config import CacheConfig, SchedulerConfig
from pagedllm.core.kv_cache_manager import KVCacheManager
from pagedllm.core.request_queue import FCFSRequestQueue, RequestQueue
from pagedllm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedllm.logger import init_logger
from pagedllm.request import Request, RequestStatus

if TYPE_CHECKING:
    from pagedllm.worker.outputs import ModelRunnerOutput

logger = init_logger(__name__)

# Log the preemption warning on the first preemption and then every this many, as vLLM does,
# so that a thrashing cache does not flood the log.
_PREEMPTION_LOG_INTERVAL = 50


@dataclass
class _StepPlan:
    """What one `schedule()` call has decided so far."""

    token_budget: int
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    new_requests: list[Request] = field(default_factory=list)
    cached_requests: list[Request] = field(default_factory=list)
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)
    num_preempted: int = 0

    def add(self, request: Request, num_tokens: int, block_ids: list[int], is_new: bool) -> None:
        """Record that `request` computes `num_tokens` tokens this step."""
        assert 0 < num_tokens <= self.token_budget
        self.num_scheduled_tokens[request.request_id] = num_tokens
        self.token_budget -= num_tokens
        self.new_block_ids[request.request_id] = block_ids
        (self.new_requests if is_new else self.cached_requests).append(request)


class Scheduler:
    """Continuous-batching scheduler with chunked prefill and recompute preemption.

    Call order per step: `schedule()` → worker → `update_from_output()`. Requests may be
    added or aborted at any time between those calls. The scheduler owns the Request objects
    it is given and is the only one that mutates them.

    Args:
        scheduler_config: token budget, sequence cap, max_model_len, chunked prefill.
        cache_config: block size.
        num_blocks: KV blocks in the pool, including the reserved null block 0.
    """

    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_blocks: int
    ) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_model_len = scheduler_config.max_model_len
        self.kv_cache_manager = KVCacheManager(num_blocks, cache_config.block_size)
        # Every unfinished request, waiting or running.
        self.requests: dict[str, Request] = {}
        self.waiting: RequestQueue = FCFSRequestQueue()
        # In admission order: the tail is the newest, hence the preemption victim.
        self.running: list[Request] = []
        # Finished, aborted or preempted since the last schedule(): the worker drops them.
        self.finished_request_ids: set[str] = set()
        self.num_preemptions = 0

    # ----------------------------------------------------------------- requests in and out

    def add_request(self, request: Request) -> None:
        """Queue a new request.

        Raises:
            ValueError: if the id is in use, the prompt is empty or longer than
                max_model_len, or the request could never fit in the KV cache alone.
        """
        if request.request_id in self.requests:
            raise ValueError(f"Request id {request.request_id!r} is already in use.")
        if request.num_prompt_tokens == 0:
            raise ValueError(f"Request {request.request_id!r} has an empty prompt.")
        if request.num_prompt_tokens > self.max_model_len:
            raise ValueError(
                f"Request {request.request_id!r} has {request.num_prompt_tokens} prompt "
                f"tokens, more than max_model_len={self.max_model_len}."
            )
        self._check_fits_alone(request)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def _check_fits_alone(self, request: Request) -> None:
        # A request whose KV cannot fit even with the whole cache to itself would wait (or be
        # preempted) forever; the engine sizes the cache so this never happens, but a bare
        # Scheduler must not deadlock either. The last sampled token is never computed.
        final_num_tokens = min(
            request.num_prompt_tokens + request.max_tokens,
            max(self.max_model_len, request.num_prompt_tokens + 1),
        )
        num_blocks = self.kv_cache_manager.get_num_blocks_needed(final_num_tokens - 1)
        if num_blocks > self.kv_cache_manager.num_usable_blocks:
            raise ValueError(
                f"Request {request.request_id!r} may need {num_blocks} KV blocks but the cache "
                f"has only {self.kv_cache_manager.num_usable_blocks}; give the KV cache more "
                "memory or lower max_tokens / max_model_len."
            )

    def abort_requests(self, request_ids: str | Iterable[str]) -> None:
        """Abort requests in any unfinished state; unknown or finished ids are ignored."""
        self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """End requests with a finished `status`, freeing their blocks at once.

        Unknown or already finished ids are ignored, so a late abort is harmless.
        """
        if not RequestStatus.is_finished(status):
            raise ValueError(f"finish_requests needs a finished status, got {status!r}.")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        finished: list[Request] = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                finished.append(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)
        if finished:
            self._remove_from_running(finished)

    def _free_request(self, request: Request) -> None:
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_request_ids.add(request.request_id)

    def _remove_from_running(self, requests: list[Request]) -> None:
        # By identity: Request compares by value, which would walk token lists.
        removed = {id(request) for request in requests}
        self.running = [request for request in self.running if id(request) not in removed]

    # ----------------------------------------------------------------------- scheduling

    def schedule(self) -> SchedulerOutput:
        """Choose this step's requests and token counts, allocating their KV blocks.

        Advances each scheduled request's `num_computed_tokens` by its scheduled count, so
        `update_from_output` only has to append sampled tokens.
        """
        plan = _StepPlan(token_budget=self.scheduler_config.max_num_batched_tokens)
        self._schedule_running(plan)
        # After a preemption the cache is tight: admitting waiting requests now would only
        # thrash, and could re-admit this step's victim in the same output.
        if plan.num_preempted == 0:
            self._schedule_waiting(plan)
        return self._make_output(plan)

    def _num_tokens_to_schedule(self, request: Request, token_budget: int) -> int:
        num_tokens = request.num_tokens - request.num_computed_tokens
        num_tokens = min(num_tokens, self.max_model_len - request.num_computed_tokens)
        return max(0, min(num_tokens, token_budget))

    def _schedule_running(self, plan: _StepPlan) -> None:
        """Give each running request its next tokens, preempting from the tail if needed."""
        index = 0
        while index < len(self.running) and plan.token_budget > 0:
            request = self.running[index]
            num_new_tokens = self._num_tokens_to_schedule(request, plan.token_budget)
            if num_new_tokens == 0:
                # Waiting for its sampled token to arrive; nothing to compute.
                index += 1
                continue
            new_block_ids = self._allocate_or_preempt(request, num_new_tokens, plan)
            if new_block_ids is None:
                # It preempted itself; being the tail, no running request is left after it.
                break
            plan.add(request, num_new_tokens, new_block_ids, is_new=False)
            index += 1

    def _allocate_or_preempt(
        self, request: Request, num_new_tokens: int, plan: _StepPlan
    ) -> list[int] | None:
        """Allocate for `request`, preempting the newest running requests until it fits.

        Returns the new block ids, or None if `request` itself had to be preempted. The head
        of `running` always fits once everyone else is preempted, because every request
        fits in the cache alone (`_check_fits_alone`), so the oldest request always advances.
        """
        while True:
            new_block_ids = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
            if new_block_ids is not None:
                return new_block_ids
            victim = self.running.pop()
            assert victim.request_id not in plan.num_scheduled_tokens, "victim already ran"
            self._preempt(victim)
            plan.num_preempted += 1
            if victim is request:
                return None

    def _preempt(self, request: Request) -> None:
        """Free `request`'s blocks and put it at the front of the waiting queue (recompute)."""
        assert request.status == RequestStatus.RUNNING
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        if self.num_preemptions % _PREEMPTION_LOG_INTERVAL == 0:
            logger.warning(
                "Sequence group %s is preempted by recompute because there is not enough KV "
                "cache space. This can hurt end-to-end performance; give the KV cache more "
                "memory or lower max_num_seqs / max_num_batched_tokens. "
                "total_num_cumulative_preemption=%d",
                request.request_id,
                self.num_preemptions + 1,
            )
        self.num_preemptions += 1
        self.waiting.prepend(request)
        # The worker must drop its state: the request comes back as a new one.
        self.finished_request_ids.add(request.request_id)

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        """Admit waiting requests in queue order while budget, seats and blocks last."""
        max_num_seqs = self.scheduler_config.max_num_seqs
        while self.waiting and plan.token_budget > 0 and len(self.running) < max_num_seqs:
            request = self.waiting.peek()
            num_new_tokens = self._num_tokens_to_schedule(request, plan.token_budget)
            assert num_new_tokens > 0, "a waiting request always has tokens to compute"
            num_remaining = request.num_tokens - request.num_computed_tokens
            if not self.scheduler_config.enable_chunked_prefill and num_new_tokens < num_remaining:
                # Without chunking the whole prompt must fit; later requests may not jump
                # ahead (FCFS), so admission stops here.
                break
            new_block_ids = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
            if new_block_ids is None:
                break
            self.waiting.pop()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.add(request, num_new_tokens, new_block_ids, is_new=True)

    def _make_output(self, plan: _StepPlan) -> SchedulerOutput:
        """Package the plan for the worker, then advance `num_computed_tokens`."""
        new_reqs = [
            NewRequestData(
                request_id=request.request_id,
                prompt_token_ids=list(request.prompt_token_ids),
                output_token_ids=list(request.output_token_ids),
                sampling_params=request.sampling_params,
                eos_token_id=request.eos_token_id,
                block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
                num_computed_tokens=request.num_computed_tokens,
            )
            for request in plan.new_requests
        ]
        cached_reqs = CachedRequestData(
            request_ids=[request.request_id for request in plan.cached_requests],
            new_block_ids=[
                plan.new_block_ids[request.request_id] for request in plan.cached_requests
            ],
            num_computed_tokens=[request.num_computed_tokens for request in plan.cached_requests],
        )
        output = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=plan.num_scheduled_tokens,
            total_num_scheduled_tokens=sum(plan.num_scheduled_tokens.values()),
            finished_request_ids=self.finished_request_ids,
        )
        self.finished_request_ids = set()
        for request in plan.cached_requests + plan.new_requests:
            request.num_computed_tokens += plan.num_scheduled_tokens[request.request_id]
        return output

    # --------------------------------------------------------------------- after the step

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[tuple[Request, list[int]]]:
        """Append sampled tokens, apply stop checks and free requests that finished.

        Returns:
            For every request that got tokens or finished this step: the Request and the
            token ids appended this step (cut after a stop token). Requests aborted since
            `schedule()` are skipped.
        """
        results: list[tuple[Request, list[int]]] = []
        finished: list[Request] = []
        for request_id, token_ids in zip(
            model_runner_output.request_ids, model_runner_output.sampled_token_ids, strict=True
        ):
            request = self.requests.get(request_id)
            if (
                request is None
                or request.status != RequestStatus.RUNNING
                or request_id not in scheduler_output.num_scheduled_tokens
            ):
                continue  # aborted (and perhaps re-added) since schedule()
            if not token_ids:
                continue  # prompt still being prefilled in chunks
            assert request.num_computed_tokens == request.num_tokens, (
                f"request {request_id} sampled before its prompt was computed"
            )
            new_token_ids = self._append_and_check_stop(request, token_ids)
            results.append((request, new_token_ids))
            if request.is_finished():
                finished.append(request)
        for request in finished:
            self._free_request(request)
        if finished:
            self._remove_from_running(finished)
        return results

    def _append_and_check_stop(self, request: Request, token_ids: list[int]) -> list[int]:
        """Append tokens one by one, stopping at the first that finishes the request."""
        appended: list[int] = []
        for token_id in token_ids:
            request.append_output_token_ids([token_id])
            appended.append(token_id)
            if self._check_stop(request, token_id):
                break
        return appended

    def _check_stop(self, request: Request, token_id: int) -> bool:
        """Set a finished status if `token_id` (just appended) ends the request."""
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id == request.eos_token_id:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if token_id in (params.stop_token_ids or ()):
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = token_id
                return True
        if request.num_output_tokens >= request.max_tokens or (
            request.num_tokens >= self.max_model_len
        ):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    # ----------------------------------------------------------------------- inspection

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission (new or preempted)."""
        return len(self.waiting)

    @property
    def kv_cache_usage(self) -> float:
        """Share of usable KV blocks in use, in [0, 1]."""
        return self.kv_cache_manager.usage

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting or running."""
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.requests)

    def has_finished_requests(self) -> bool:
        """True when the next `schedule()` will tell the worker to drop some requests."""
        return bool(self.finished_request_ids)

    def check_integrity(self) -> None:
        """Assert the scheduler's and the KV cache's invariants."""
        self.kv_cache_manager.check_integrity()
        running_ids = [request.request_id for request in self.running]
        waiting_ids = [request.request_id for request in self.waiting]
        assert len(set(running_ids)) == len(running_ids), "a request runs twice"
        assert len(set(waiting_ids)) == len(waiting_ids), "a request waits twice"
        assert set(running_ids).isdisjoint(waiting_ids), "a request both waits and runs"
        assert set(running_ids) | set(waiting_ids) == set(self.requests), "a request is lost"
        assert len(self.running) <= self.scheduler_config.max_num_seqs
        assert self.kv_cache_manager.get_request_ids() <= set(running_ids), (
            "a request that is not running holds KV blocks"
        )
        block_size = self.cache_config.block_size
        for request in self.running:
            assert request.status == RequestStatus.RUNNING
            assert 0 <= request.num_computed_tokens <= request.num_tokens
            assert request.num_computed_tokens <= self.max_model_len
            num_blocks = len(self.kv_cache_manager.get_block_ids(request.request_id))
            assert num_blocks * block_size >= request.num_computed_tokens
        for request in self.waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert request.num_computed_tokens == 0
