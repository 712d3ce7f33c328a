"""Scheduler: decides, each step, which requests run and how many tokens each computes.

One token-budget loop in the style of vLLM v1: running requests first, then swapped-out
ones, then waiting ones (from their longest cached prefix) in queue order, within
`max_num_batched_tokens` and `max_num_seqs`. When KV blocks run out it preempts the running
batch's tail (the newest request; under the priority policy the lowest-priority one) by swap
or recompute; under the priority policy a waiting request also preempts lower-priority
running ones. `update_from_output` appends sampled tokens and applies token-id stop checks.

Pooling requests (embeddings, class scores) have a queue of their own, served first each
step: a pooling request computes its whole prompt in one step and ends with it, so it holds
no seat (`max_num_seqs` bounds the generating batch) and waits at most one step behind
generations. The budget it takes leaves one token for every running request. On a model
without a KV cache (an encoder) it takes no blocks.
Blocks are reached only through `KVCacheManager` / `SwapManager`; no torch, worker, engine.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pagedllm.config import CacheConfig, SchedulerConfig
from pagedllm.core.kv_cache_groups import KVCacheGroupSpec
from pagedllm.core.kv_cache_manager import BlockIds, KVCacheManager
from pagedllm.core.request_queue import RequestQueue, create_request_queue
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.core.spec_tokens import SpecDecodeCounters, drafts_to_schedule
from pagedllm.core.step_plan import StepPlan
from pagedllm.core.stop_check import append_and_check_stop
from pagedllm.core.swap_manager import SwapManager
from pagedllm.logger import init_logger
from pagedllm.metrics.stats import SchedulerStats
from pagedllm.request import Request, RequestStatus

if TYPE_CHECKING:
    from pagedllm.worker.outputs import ModelRunnerOutput

logger = init_logger(__name__)

# Log the preemption warning on the first preemption and then every this many, as vLLM does,
# so that a thrashing cache does not flood the log.
_PREEMPTION_LOG_INTERVAL = 50


class Scheduler:
    """Continuous-batching scheduler with chunked prefill, prefix caching and preemption.

    Call order per step: `schedule()` → worker → `update_from_output()`. Requests may be
    added or aborted at any time between those calls. The scheduler owns the Request objects
    it is given and is the only one that mutates them.

    Args:
        scheduler_config: token budget, sequence cap, max_model_len, chunked prefill,
            preemption mode and scheduling policy.
        cache_config: block size, prefix caching.
        num_blocks: KV blocks in the pool, including the reserved null block 0.
        num_cpu_blocks: host blocks for swap preemption, including an unused block 0 (the
            engine sizes it from `swap_space`); fewer than 2 makes every preemption a
            recompute. Ignored unless preemption_mode is "swap".
        kv_cache_groups: the model's KV cache groups (None: one full-attention group; empty:
            the model keeps no KV cache and serves pooling requests only).
        max_loras: the most LoRA adapters one step may use (None: LoRA off); requests of
            other adapters wait for a later step.
        num_lookahead_slots: KV slots reserved past the tokens of a request that samples in
            a step, for a drafter's own KV (speculative decoding with a draft model or
            EAGLE); freed again after the step.
        send_token_ids: tell the workers the output tokens each step computes (several
            ranks: only one samples, so the others cannot keep their own).
        num_concurrent_batches: steps in flight at once (pipeline parallelism: one per
            stage, vLLM's virtual engines). A request in flight has nothing to compute until
            its step comes back, and each step takes at most 1/n of the running requests,
            so n steps fill the n stages.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        num_cpu_blocks: int = 0,
        kv_cache_groups: tuple[KVCacheGroupSpec, ...] | None = None,
        max_loras: int | None = None,
        num_lookahead_slots: int = 0,
        send_token_ids: bool = False,
        num_concurrent_batches: int = 1,
    ) -> None:
        self.scheduler_config = scheduler_config
        self.send_token_ids = send_token_ids
        self.num_concurrent_batches = num_concurrent_batches
        # Steps in flight (several at once): id(SchedulerOutput) -> request id -> its
        # preemption count when scheduled; a request preempted since then drops the output.
        self._in_flight: dict[int, dict[str, int]] = {}
        self.max_loras = max_loras
        self.num_lookahead_slots = num_lookahead_slots
        self.cache_config = cache_config
        self.max_model_len = scheduler_config.max_model_len
        self.has_kv_cache = kv_cache_groups != ()
        self.kv_cache_manager = KVCacheManager(
            num_blocks,
            cache_config.block_size,
            cache_config.enable_prefix_caching,
            groups=kv_cache_groups,
            max_chunk_tokens=scheduler_config.max_num_batched_tokens,
        )
        is_swap = scheduler_config.preemption_mode == "swap"
        self.swap_manager = SwapManager(num_cpu_blocks if is_swap else 0)
        # Every unfinished request, waiting, running or swapped.
        self.requests: dict[str, Request] = {}
        # The waiting queue is also the policy: it orders `running` and says who preempts.
        self.waiting: RequestQueue = create_request_queue(scheduler_config.scheduling_policy)
        self.swapped: RequestQueue = create_request_queue(scheduler_config.scheduling_policy)
        # In scheduling order: the tail is the preemption victim.
        self.running: list[Request] = []
        # Pooling requests: waiting in arrival order, and those scheduled in this step.
        self.waiting_pooling: deque[Request] = deque()
        self.pooling_in_step: list[Request] = []
        # Finished, aborted or preempted since the last schedule(): the worker drops them.
        self.finished_request_ids: set[str] = set()
        self.num_preemptions = 0
        # Prompt tokens the model ran (prefix hits excluded, recomputed ones included).
        self.num_computed_prompt_tokens = 0
        # Speculative decoding: how the drafts verified so far fared, and the block tables
        # cut after rejections that the worker has not been told about yet.
        self.spec_counters = SpecDecodeCounters()
        self.trimmed_tables: dict[str, int] = {}

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
        if request.is_pooling:
            self._check_pooling_fits(request)
        else:
            self._check_fits_alone(request)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        if request.is_pooling:
            self.waiting_pooling.append(request)
        else:
            self.waiting.add(request)

    def _check_pooling_fits(self, request: Request) -> None:
        # Computed in one step: the whole prompt must fit the budget and the cache.
        budget = self.scheduler_config.max_num_batched_tokens
        if request.num_prompt_tokens > budget:
            raise ValueError(
                f"Pooling request {request.request_id!r} has {request.num_prompt_tokens} "
                f"tokens, more than max_num_batched_tokens={budget}; it is computed in one "
                "step. Raise max_num_batched_tokens or truncate the input."
            )
        num_blocks = self._num_pooling_blocks(request)
        if num_blocks > self.kv_cache_manager.num_usable_blocks:
            raise ValueError(
                f"Pooling request {request.request_id!r} needs {num_blocks} KV blocks but "
                f"the cache has only {self.kv_cache_manager.num_usable_blocks}."
            )

    def _num_pooling_blocks(self, request: Request) -> int:
        if not self.has_kv_cache:
            return 0
        return self.kv_cache_manager.get_num_blocks_needed(request.num_prompt_tokens)

    def _check_fits_alone(self, request: Request) -> None:
        # A request that cannot fit even alone would wait forever; the engine sizes the cache
        # so this never happens. The last sampled token is never computed.
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
        """End requests with a finished `status`, freeing their blocks (device and host).

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
            if request.is_pooling:
                self._drop_pooling(request)
            elif request.status == RequestStatus.RUNNING:
                finished.append(request)
            elif request.status == RequestStatus.SWAPPED:
                self.swapped.remove(request)
                self.swap_manager.free(request_id)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)
        if finished:
            self._remove_from_running(finished)

    def _drop_pooling(self, request: Request) -> None:
        """Take a pooling request out of its queue (waiting, or scheduled this step)."""
        if request.status == RequestStatus.RUNNING:
            self.pooling_in_step = [r for r in self.pooling_in_step if r is not request]
        else:
            self.waiting_pooling.remove(request)

    def _free_request(self, request: Request) -> None:
        assert request.is_finished()
        if self.has_kv_cache:
            self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.trimmed_tables.pop(request.request_id, None)
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
        plan = StepPlan(token_budget=self.scheduler_config.max_num_batched_tokens)
        self._schedule_pooling(plan)
        self.running = self.waiting.order_running(self.running)
        self._preempt_for_waiting(plan)
        self._schedule_running(plan)
        # After a preemption for space the cache is tight: admitting others now would only
        # thrash. A swap-in never shares a step with a swap-out (see sched_output.py).
        if plan.num_preempted_running == 0:
            if not plan.blocks_to_swap_out:
                self._schedule_swapped(plan)
            self._schedule_waiting(plan)
        return self._make_output(plan)

    def _schedule_pooling(self, plan: StepPlan) -> None:
        """Admit waiting pooling requests, whole, in arrival order, before anything else.

        One budget token stays for each running request, so generations keep their pace.
        """
        reserve = len(self.running)
        while self.waiting_pooling:
            request = self.waiting_pooling[0]
            num_tokens = request.num_prompt_tokens
            if num_tokens > plan.token_budget - reserve:
                break
            block_ids: BlockIds = ()
            if self.has_kv_cache:
                # Never read from the prefix cache: pooling needs every position's state.
                allocated = self.kv_cache_manager.allocate_slots(request, num_tokens)
                if allocated is None:
                    break  # the cache is full: generations free blocks as they finish
                block_ids = allocated
            self.waiting_pooling.popleft()
            request.status = RequestStatus.RUNNING
            request.num_cached_tokens, request.first_scheduled_time = 0, time.time()
            self.pooling_in_step.append(request)
            plan.add(request, num_tokens, block_ids, is_new=True)

    def _num_tokens_to_schedule(
        self, request: Request, token_budget: int, num_computed_tokens: int | None = None
    ) -> int:
        """Tokens `request` computes now (0: none), from `num_computed_tokens` on."""
        if num_computed_tokens is None:
            num_computed_tokens = request.num_computed_tokens
        num_remaining = request.num_tokens - num_computed_tokens
        num_tokens = min(num_remaining, self.max_model_len - num_computed_tokens, token_budget)
        if not self.scheduler_config.enable_chunked_prefill and num_tokens < num_remaining:
            # Without chunking the whole rest must fit this step.
            return 0
        return max(0, num_tokens)

    def _schedule_running(self, plan: StepPlan) -> None:
        """Give each running request its next tokens, preempting from the tail if needed."""
        index = 0
        share = -(-len(self.running) // self.num_concurrent_batches)  # ceil
        while (
            index < len(self.running) and plan.token_budget > 0
            and len(plan.cached_requests) < share
        ):
            request = self.running[index]
            num_new_tokens = self._num_tokens_to_schedule(request, plan.token_budget)
            if num_new_tokens == 0 or not self._lora_fits(request, plan):
                # Nothing to compute now (or, unchunked, too little budget left; or its
                # adapter would be one too many this step).
                index += 1
                continue
            drafts = drafts_to_schedule(
                request, num_new_tokens, plan.token_budget, self.max_model_len
            )
            num_new_tokens += len(drafts)
            new_block_ids = self._allocate_or_preempt(
                request, num_new_tokens, plan, self._lookahead(request, num_new_tokens)
            )
            if new_block_ids is None:
                # It preempted itself; being the tail, no running request is left after it.
                break
            plan.add(request, num_new_tokens, new_block_ids, is_new=False, spec_token_ids=drafts)
            index += 1

    def _lookahead(self, request: Request, num_new_tokens: int, start: int | None = None) -> int:
        """Lookahead slots `request` takes past its `num_new_tokens` (from `start`, default
        its computed tokens): only when it samples this step, within its final length."""
        if not self.num_lookahead_slots:
            return 0
        end = (request.num_computed_tokens if start is None else start) + num_new_tokens
        if end < request.num_tokens:
            return 0  # mid-prefill: it samples nothing this step
        final = min(self.max_model_len, request.num_prompt_tokens + request.max_tokens)
        return max(0, min(self.num_lookahead_slots, final - end))

    def _allocate_or_preempt(
        self, request: Request, num_new_tokens: int, plan: StepPlan, num_lookahead: int = 0
    ) -> BlockIds | None:
        """Allocate for `request`, preempting the running tail until it fits.

        Returns the new block ids, or None if `request` itself had to be preempted. The head
        of `running` always fits once everyone else is preempted, because every request
        fits in the cache alone (`_check_fits_alone`), so the head always advances.
        """
        while True:
            new_block_ids = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens + num_lookahead
            )
            if new_block_ids is not None:
                return new_block_ids
            victim = self.running.pop()
            assert victim.request_id not in plan.num_scheduled_tokens, "victim already ran"
            self._preempt(victim, plan)
            plan.num_preempted_running += 1
            if victim is request:
                return None

    def _preempt_for_waiting(self, plan: StepPlan) -> None:
        """Preempt running requests the waiting head outranks until the head fits.

        Only the priority policy lets a waiting request outrank a running one.
        """
        while self.waiting and self.running:
            head, victim = self.waiting.peek(), self.running[-1]
            if not self.waiting.outranks(head, victim) or self._can_admit(head, plan):
                return
            self.running.pop()
            self._preempt(victim, plan)

    def _can_admit(self, request: Request, plan: StepPlan) -> bool:
        """True if the waiting `request` would get a seat and blocks now."""
        if len(self.running) >= self.scheduler_config.max_num_seqs:
            return False
        blocks, num_cached = self.kv_cache_manager.get_computed_blocks(request)
        num_new_tokens = self._num_tokens_to_schedule(request, plan.token_budget, num_cached)
        num_lookahead = self._lookahead(request, num_new_tokens, num_cached)
        return num_new_tokens > 0 and self.kv_cache_manager.can_allocate(
            request, num_new_tokens + num_lookahead, blocks
        )

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        """Take `request` (already out of `running`) off the device: swap, else recompute."""
        assert request.status == RequestStatus.RUNNING
        request.spec_token_ids = []  # proposed for a step it will not run
        is_swapped = self._swap_out(request, plan)
        if not is_swapped:
            self.kv_cache_manager.free(request)
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
            self.waiting.prepend(request)
        request.num_preemptions += 1
        if self.num_preemptions % _PREEMPTION_LOG_INTERVAL == 0:
            logger.warning(
                "Sequence group %s is preempted by %s mode because there is not enough KV "
                "cache space. This can hurt end-to-end performance; give the KV cache more "
                "memory or lower max_num_seqs / max_num_batched_tokens. "
                "total_num_cumulative_preemption=%d",
                request.request_id,
                "swap" if is_swapped else "recompute",
                self.num_preemptions + 1,
            )
        self.num_preemptions += 1
        plan.preempted_ids.add(request.request_id)
        # The worker must drop its state: the request comes back as a new one.
        self.finished_request_ids.add(request.request_id)
        self.trimmed_tables.pop(request.request_id, None)

    def _swap_out(self, request: Request, plan: StepPlan) -> bool:
        """Move `request`'s KV to host blocks (swap mode); False if it must recompute."""
        if self.scheduler_config.preemption_mode != "swap":
            return False
        # Blocks that left a sliding window are not worth copying.
        self.kv_cache_manager.remove_skipped_blocks(request)
        num_blocks = self.kv_cache_manager.get_num_blocks_held(request.num_computed_tokens)
        block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
        assert sum(len([i for i in t if i]) for t in block_ids) == num_blocks, (
            "a preempted request holds unused blocks"
        )
        if num_blocks == 0 or not self.swap_manager.can_swap_out(num_blocks):
            return False
        pairs = self.swap_manager.swap_out(request.request_id, block_ids)
        plan.blocks_to_swap_out.extend(pairs)
        # Freed device blocks keep their cached hashes; the worker copies them out before
        # this step's forward pass can overwrite them.
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.SWAPPED
        self.swapped.prepend(request)
        return True

    def _schedule_swapped(self, plan: StepPlan) -> None:
        """Swap requests back in, in queue order, while budget, seats and blocks last."""
        max_num_seqs = self.scheduler_config.max_num_seqs
        while self.swapped and plan.token_budget > 0 and len(self.running) < max_num_seqs:
            request = self.swapped.peek()
            if self.waiting and self.waiting.outranks(self.waiting.peek(), request):
                break
            if not self._lora_fits(request, plan):
                break
            num_new_tokens = self._num_tokens_to_schedule(request, plan.token_budget)
            if num_new_tokens == 0:
                break
            new_block_ids = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens + self._lookahead(request, num_new_tokens)
            )
            if new_block_ids is None:
                break
            self.swapped.pop()
            block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
            plan.blocks_to_swap_in.extend(self.swap_manager.swap_in(request.request_id, block_ids))
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            # Sent in full: the worker replaces its block table and keeps the computed KV.
            plan.add(request, num_new_tokens, new_block_ids, is_new=True)

    def _schedule_waiting(self, plan: StepPlan) -> None:
        """Admit waiting requests in queue order while budget, seats and blocks last.

        A request whose grammar is still compiling is passed over (it keeps its place).
        """
        compiling: list[Request] = []
        try:
            self._admit_waiting(plan, compiling)
        finally:
            for request in reversed(compiling):
                self.waiting.prepend(request)

    def _admit_waiting(self, plan: StepPlan, compiling: list[Request]) -> None:
        max_num_seqs = self.scheduler_config.max_num_seqs
        manager = self.kv_cache_manager
        while self.waiting and plan.token_budget > 0 and len(self.running) < max_num_seqs:
            request = self.waiting.peek()
            if request.request_id in plan.preempted_ids:
                break  # preempted this step: re-admitting it now would only thrash
            grammar = request.structured_output
            if (grammar is not None and not grammar.is_ready()) or not self._lora_fits(
                request, plan
            ):
                # Compiling, or one adapter too many this step: it keeps its place.
                compiling.append(self.waiting.pop())
                continue
            if grammar is not None and grammar.error is not None:
                self._fail_grammar(request, grammar.error)
                continue
            if self.swapped and not self.waiting.outranks(request, self.swapped.peek()):
                break  # swapped requests resume first
            computed_blocks, num_cached = manager.get_computed_blocks(request)
            num_new_tokens = self._num_tokens_to_schedule(request, plan.token_budget, num_cached)
            if num_new_tokens == 0:
                break  # unchunked and too little budget: later requests may not jump ahead
            num_lookahead = self._lookahead(request, num_new_tokens, num_cached)
            new_block_ids = manager.allocate_slots(
                request, num_new_tokens + num_lookahead, computed_blocks
            )
            if new_block_ids is None:
                break
            self.waiting.pop()
            request.num_computed_tokens = num_cached
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_cached
                request.first_scheduled_time = time.time()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.add(request, num_new_tokens, new_block_ids, is_new=True)

    def _lora_fits(self, request: Request, plan: StepPlan) -> bool:
        """True unless `request`'s adapter would be one more than max_loras this step."""
        lora = request.lora_request
        if lora is None or self.max_loras is None or lora.lora_int_id in plan.lora_ids:
            return True
        return len(plan.lora_ids) < self.max_loras

    def _fail_grammar(self, request: Request, error: str) -> None:
        logger.error("Request %s: its grammar did not compile: %s", request.request_id, error)
        self.waiting.pop()
        request.status = RequestStatus.FINISHED_ABORTED
        self._free_request(request)

    def _make_output(self, plan: StepPlan) -> SchedulerOutput:
        """Package the plan for the worker, then advance `num_computed_tokens`."""
        output = plan.make_output(
            self._get_block_ids, self.finished_request_ids, self.trimmed_tables,
            self.send_token_ids,
        )
        self.finished_request_ids = set()
        if self.num_concurrent_batches > 1:
            self._in_flight[id(output)] = {
                request.request_id: request.num_preemptions
                for request in plan.cached_requests + plan.new_requests
            }
        for request in plan.cached_requests + plan.new_requests:
            start = request.num_computed_tokens
            request.num_computed_tokens += plan.num_scheduled_tokens[request.request_id]
            num_prompt = request.num_prompt_tokens
            self.num_computed_prompt_tokens += max(
                0, min(request.num_computed_tokens, num_prompt) - min(start, num_prompt)
            )
        return output

    def _get_block_ids(self, request_id: str) -> BlockIds:
        if not self.has_kv_cache:
            return ()
        return self.kv_cache_manager.get_block_ids(request_id)

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
        preemptions = self._in_flight.pop(id(scheduler_output), None)
        failed_ids = set(model_runner_output.failed_request_ids)
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
            if preemptions is not None and preemptions.get(request_id) != request.num_preemptions:
                continue  # preempted while the step was in flight (and scheduled again)
            if failed_ids and request_id in failed_ids:
                self._fail(request)
                results.append((request, []))
                finished.append(request)
                continue
            if not token_ids:
                continue  # prompt still being prefilled in chunks
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(request_id)
            if drafts:
                self._roll_back_rejected(request, len(drafts), len(token_ids) - 1)
            if self.num_lookahead_slots:
                self._trim(request)  # the lookahead slots served their step
            assert request.num_computed_tokens == request.num_tokens + len(token_ids) - 1, (
                f"request {request_id} sampled before its prompt was computed"
            )
            if request.structured_output is None:
                new_token_ids = append_and_check_stop(request, token_ids, self.max_model_len)
            else:
                new_token_ids = self._append_constrained(request, token_ids)
            results.append((request, new_token_ids))
            if request.is_finished():
                finished.append(request)
            else:
                request.spec_token_ids = model_runner_output.spec_token_ids.get(request_id, [])
        for request in finished:
            self._free_request(request)
        if finished:
            self._remove_from_running(finished)
        results.extend(self._finish_pooling(scheduler_output, model_runner_output))
        return results

    def _fail(self, request: Request) -> None:
        """End a request whose forward went non-finite. The blocks only it holds leave the
        prefix cache: whatever they hold must not be served to a later request."""
        request.status = RequestStatus.FINISHED_ERROR
        if self.has_kv_cache:
            self.kv_cache_manager.forget_cached_blocks(request)

    def _roll_back_rejected(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """Un-compute the positions of rejected drafts and free the blocks that held only
        them; their KV is overwritten when real tokens reach those positions."""
        self.spec_counters.observe(num_drafts, num_accepted)
        num_rejected = num_drafts - num_accepted
        if num_rejected:
            request.num_computed_tokens -= num_rejected
            self._trim(request)

    def _trim(self, request: Request) -> None:
        """Free the blocks past the request's computed tokens; tell the worker next step."""
        num_kept = self.kv_cache_manager.trim(request)
        if num_kept is not None:
            self.trimmed_tables[request.request_id] = num_kept

    def _finish_pooling(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[tuple[Request, list[int]]]:
        """End the pooling requests of the step: each has its pooled output now."""
        results: list[tuple[Request, list[int]]] = []
        for request in self.pooling_in_step:
            if request.request_id not in scheduler_output.num_scheduled_tokens:
                continue  # scheduled by a later schedule() (not possible in one step)
            assert request.request_id in model_runner_output.pooler_output, (
                f"pooling request {request.request_id} got no pooled output"
            )
            request.status = RequestStatus.FINISHED_STOPPED
            self._free_request(request)
            results.append((request, []))
        self.pooling_in_step = [r for r in self.pooling_in_step if not r.is_finished()]
        return results

    def _append_constrained(self, request: Request, token_ids: list[int]) -> list[int]:
        """Append tokens one at a time, each through the grammar: a grammar that completes
        ends the request at that token, as one-token steps would."""
        appended: list[int] = []
        for token_id in token_ids:
            appended += append_and_check_stop(request, [token_id], self.max_model_len)
            self._advance_grammar(request, [token_id])
            if request.is_finished():
                break
        return appended

    @staticmethod
    def _advance_grammar(request: Request, new_token_ids: list[int]) -> None:
        """Move the request's matcher over its new tokens; a complete grammar ends it."""
        grammar = request.structured_output
        if not grammar.accept_tokens(new_token_ids):
            # Only a token outside the bitmask gets here: when other masks (min_tokens,
            # allowed_token_ids, bad_words) left no allowed token. End it rather than let it
            # run on unconstrained.
            logger.error(
                "Request %s sampled a token its grammar does not allow; stopping it.",
                request.request_id,
            )
            if not request.is_finished():
                request.status = RequestStatus.FINISHED_STOPPED
        elif grammar.is_terminated() and not request.is_finished():
            request.status = RequestStatus.FINISHED_STOPPED

    # ----------------------------------------------------------------------- inspection

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission (new or preempted by recompute)."""
        return len(self.waiting)

    @property
    def num_swapped(self) -> int:
        """Requests preempted to the host swap space."""
        return len(self.swapped)

    @property
    def kv_cache_usage(self) -> float:
        """Share of usable KV blocks in use, in [0, 1]."""
        return self.kv_cache_manager.usage

    def make_stats(self) -> SchedulerStats:
        """A snapshot of the scheduler's state and cumulative counters."""
        manager = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=self.num_running,
            num_waiting_reqs=self.num_waiting + len(self.waiting_pooling),
            num_swapped_reqs=self.num_swapped,
            kv_cache_usage=manager.usage,
            cpu_kv_cache_usage=self.swap_manager.usage,
            prefix_cache_queries=manager.prefix_cache_queries,
            prefix_cache_hits=manager.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_computed_prompt_tokens=self.num_computed_prompt_tokens,
            spec_num_drafts=self.spec_counters.num_drafts,
            spec_num_draft_tokens=self.spec_counters.num_draft_tokens,
            spec_num_accepted_tokens=self.spec_counters.num_accepted_tokens,
            spec_accepted_per_pos=list(self.spec_counters.accepted_per_pos),
        )

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing done) while any request holds blocks."""
        return self.kv_cache_manager.reset_prefix_cache()

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting, running or swapped."""
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits, runs or is swapped out."""
        return bool(self.requests)

    def has_finished_requests(self) -> bool:
        """True when the next `schedule()` will tell the worker to drop some requests."""
        return bool(self.finished_request_ids)

    def check_integrity(self) -> None:
        """Assert the scheduler's, the KV cache's and the swap space's invariants."""
        self.kv_cache_manager.check_integrity()
        self.swap_manager.check_integrity()
        queues = {
            RequestStatus.RUNNING: [r.request_id for r in self.running],
            RequestStatus.WAITING: [r.request_id for r in self.waiting],
            RequestStatus.SWAPPED: [r.request_id for r in self.swapped],
        }
        pooling = [r.request_id for r in (*self.waiting_pooling, *self.pooling_in_step)]
        all_ids = [request_id for ids in queues.values() for request_id in ids] + pooling
        assert len(set(all_ids)) == len(all_ids), "a request is queued twice"
        assert set(all_ids) == set(self.requests), "a request is lost"
        assert len(self.running) <= self.scheduler_config.max_num_seqs
        in_step = {r.request_id for r in self.pooling_in_step}
        holders = set(queues[RequestStatus.RUNNING]) | in_step
        assert self.kv_cache_manager.get_request_ids() <= holders, (
            "a request that is not running holds KV blocks"
        )
        assert self.swap_manager.get_request_ids() == set(queues[RequestStatus.SWAPPED])
        self._check_request_states()

    def _check_request_states(self) -> None:
        block_size = self.cache_config.block_size
        manager = self.kv_cache_manager
        for request in self.running:
            assert request.status == RequestStatus.RUNNING
            # Between schedule() and update_from_output() drafts count as computed.
            num_known = request.num_tokens + len(request.spec_token_ids)
            assert 0 <= request.num_computed_tokens <= num_known
            assert request.num_computed_tokens <= self.max_model_len
            for table in manager.get_block_ids(request.request_id):
                assert len(table) * block_size >= request.num_computed_tokens
        for request in self.waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert request.num_computed_tokens == 0
        for request in self.swapped:
            assert request.status == RequestStatus.SWAPPED
            num_host_blocks = self.swap_manager.get_num_host_blocks(request.request_id)
            num_held = manager.get_num_blocks_held(request.num_computed_tokens)
            assert num_host_blocks == num_held > 0
