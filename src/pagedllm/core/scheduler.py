"""Scheduler: decides, each step, which requests run and how many tokens each computes.

One token-budget loop in the style of vLLM v1: pooling requests first (admission_queues.py:
whole, one step each), then the running requests' next tokens, then admission from the
swapped and waiting queues, in queue order, within `max_num_batched_tokens` and
`max_num_seqs` (and, while requests decode, `prefill_tokens_per_decode` prompt tokens per
decoding request where set). Admission is one loop over a queue that asks a list of checks
(admission.py: eligibility, the queue's order, budget and blocks); when KV blocks run out
for a running request the running batch's tail (the newest request; under the priority
policy the lowest-priority one) is preempted by swap or recompute (preemption.py).
`update_from_output` hands each request's tokens to the post-step processors (post_step.py:
draft rollback, stop checks, grammar advance). Which checks and processors exist follows
from the configs, once. Blocks are reached only through `KVCacheManager` / `SwapManager`;
no torch, worker, engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pagedllm.config import MIN_PREFILL_CHUNK, CacheConfig, ParallelConfig, SchedulerConfig
from pagedllm.core.admission import (
    AdmissionCheck,
    Candidate,
    EncoderInputs,
    GrammarReady,
    KVBlocks,
    LookaheadSlots,
    LoRASlots,
    NotPreemptedThisStep,
    TokenBudget,
    Verdict,
    ask,
    check_ever_fits,
)
from pagedllm.core.admission_queues import (
    AdmissionQueue,
    PoolingQueue,
    SwappedAdmission,
    WaitingAdmission,
)
from pagedllm.core.integrity import check_scheduler_integrity
from pagedllm.core.kv_cache_groups import KVCacheCapacity
from pagedllm.core.kv_cache_manager import BlockIds, KVCacheManager
from pagedllm.core.multi_step import MultiStepAdvance, MultiStepPolicy
from pagedllm.core.post_step import (
    DraftRollback,
    GrammarAdvance,
    LookaheadRelease,
    PostStepProcessor,
    StopCheck,
    apply_processors,
)
from pagedllm.core.preemption import Preemption
from pagedllm.core.remote_kv import RemoteKVAdmission
from pagedllm.core.request_queue import RequestQueue, create_request_queue
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.core.snapshot import scheduler_stats
from pagedllm.core.spec_tokens import SpecDecodeCounters, drafts_to_schedule
from pagedllm.core.step_plan import StepPlan, is_prefill
from pagedllm.core.swap_manager import SwapManager
from pagedllm.distributed.kv_transfer.base import (
    KVConnectorOutput,
    ScheduledKV,
    transfer_params,
)
from pagedllm.metrics.stats import SchedulerStats
from pagedllm.multimodal.encoder_cache import EncoderPlan, EncoderScheduler
from pagedllm.request import Request, RequestStatus

if TYPE_CHECKING:
    from pagedllm.config import LoRAConfig, SpeculativeConfig
    from pagedllm.worker.outputs import ModelRunnerOutput

# A step without news of a KV connector's transfers (read only).
_NO_TRANSFERS = KVConnectorOutput()


class Scheduler:
    """Continuous-batching scheduler with chunked prefill, prefix caching and preemption.

    Call order per step: `schedule()` → worker → `update_from_output()`. Requests may be
    added or aborted at any time between those calls. The scheduler owns the Request objects
    it is given and is the only one that mutates them.

    Args:
        scheduler_config: token budget, sequence cap, max_model_len, chunked prefill,
            preemption mode and scheduling policy.
        cache_config: block size, prefix caching.
        capacity: the KV cache the worker made: blocks, host blocks for swap preemption,
            its groups (core/kv_cache_groups.py).
        lora_config: multi-LoRA (None: off): at most `max_loras` adapters a step.
        speculative_config: speculative decoding (None: off): its lookahead slots.
        parallel_config: several ranks get the step's tokens from the scheduler; pipeline
            stages keep that many steps in flight (vLLM's virtual engines).
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        capacity: KVCacheCapacity,
        lora_config: LoRAConfig | None = None,
        speculative_config: SpeculativeConfig | None = None,
        parallel_config: ParallelConfig | None = None,
    ) -> None:
        parallel = parallel_config or ParallelConfig()
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_model_len = scheduler_config.max_model_len
        # Several ranks: only one samples, so the others learn the tokens from here.
        self.send_token_ids = parallel.world_size > 1
        self.num_concurrent_batches = parallel.pipeline_parallel_size
        # KV slots reserved past a sampling request's tokens for a drafter's own KV.
        self.num_lookahead_slots = (
            speculative_config.num_lookahead_slots if speculative_config else 0
        )
        self._lookahead = LookaheadSlots(self.num_lookahead_slots, self.max_model_len)
        self.multi_step = MultiStepPolicy(scheduler_config.num_scheduler_steps,
                                          self.max_model_len)
        self.has_kv_cache = capacity.groups != ()
        self.kv_cache_manager = KVCacheManager(
            capacity.num_blocks, cache_config.block_size, cache_config.enable_prefix_caching,
            groups=capacity.groups, max_chunk_tokens=scheduler_config.max_num_batched_tokens,
        )
        is_swap = scheduler_config.preemption_mode == "swap"
        self.swap_manager = SwapManager(capacity.num_cpu_blocks if is_swap else 0)
        # Every unfinished request, waiting, running, swapped or pooling.
        self.requests: dict[str, Request] = {}
        # The waiting queue is also the policy: it orders `running` and says who preempts.
        self.waiting: RequestQueue = create_request_queue(scheduler_config.scheduling_policy)
        self.swapped: RequestQueue = create_request_queue(scheduler_config.scheduling_policy)
        # In scheduling order: the tail is the preemption victim.
        self.running: list[Request] = []
        self.pooling = PoolingQueue(lambda: len(self.running))
        # Finished, aborted or preempted since the last schedule(): the worker drops them.
        self.finished_request_ids: set[str] = set()
        # Prompt tokens the model ran (prefix hits excluded, recomputed ones included).
        self.num_computed_prompt_tokens = 0
        # Speculative decoding: how the drafts verified so far fared, and the block tables
        # cut after rejections that the worker has not been told about yet.
        self.spec_counters = SpecDecodeCounters()
        self.trimmed_tables: dict[str, int] = {}
        # Steps in flight (several at once): id(SchedulerOutput) -> request id -> its
        # preemption count when scheduled; a request preempted since then drops the output.
        self._in_flight: dict[int, dict[str, int]] = {}
        # A vision-language model's encoder: its budget per step and its cache's entries
        # (a text-only model's has none, and refuses requests with images).
        self.encoder = EncoderScheduler(
            scheduler_config.max_num_encoder_input_tokens, scheduler_config.encoder_cache_size
        )
        self.preemption = Preemption(
            scheduler_config, self.kv_cache_manager, self.swap_manager, self.waiting,
            self.swapped, self._forget_preempted,
        )
        self._build_checks(lora_config)
        self.processors = self._post_step_processors()

    def _build_checks(self, lora_config: LoRAConfig | None) -> None:
        """The admission checks these configs ask for (admission.py), and the queues."""
        self.lora_slots = LoRASlots(lora_config.max_loras) if lora_config else None
        # An adapter that does not fit passes a request over before its grammar is looked
        # at (a request that is passed over is never failed this step).
        self.eligibility: list[AdmissionCheck] = [NotPreemptedThisStep()]
        if self.lora_slots is not None:
            self.eligibility.append(self.lora_slots)
        self.eligibility.append(GrammarReady())
        self.token_budget = TokenBudget(self.scheduler_config)
        self.encoder_inputs = EncoderInputs(
            self.encoder, self.scheduler_config.enable_chunked_prefill, self.token_budget
        )
        self.capacity_checks: list[AdmissionCheck] = [
            self.token_budget,
            self.encoder_inputs,
            KVBlocks(self.kv_cache_manager, self.has_kv_cache, self._lookahead),
        ]
        manager = self.kv_cache_manager
        self.waiting_admission = WaitingAdmission(self.waiting, self.swapped, manager)
        self.swapped_admission = SwappedAdmission(
            self.swapped, self.waiting, manager, self.swap_manager
        )
        # A KV connector's asynchronous loads (parked requests) and held sends.
        self.remote_kv = RemoteKVAdmission()
        self.kv_sending: dict[str, Request] = {}

    def _post_step_processors(self) -> list[PostStepProcessor]:
        """The per-request rules these configs ask for (post_step.py), in order."""
        processors: list[PostStepProcessor] = [DraftRollback(self.spec_counters, self._trim)]
        if self.multi_step.enabled:
            processors.append(MultiStepAdvance())  # (before the slots past it are freed)
        if self.num_lookahead_slots or self.multi_step.enabled:
            processors.append(LookaheadRelease(self._trim))
        return [*processors, StopCheck(self.max_model_len), GrammarAdvance()]

    # ----------------------------------------------------------------- requests in and out

    def add_request(self, request: Request) -> None:
        """Queue a new request.

        Raises:
            ValueError: if the id is in use, the prompt is empty or longer than
                max_model_len, or the request could never fit in the KV cache alone.
        """
        if request.request_id in self.requests:
            raise ValueError(f"Request id {request.request_id!r} is already in use.")
        if request.request_id in self.kv_sending:
            raise ValueError(f"Request id {request.request_id!r} is still in use: its KV "
                             "blocks wait for a KV connector's peer to pull them.")
        if request.num_prompt_tokens == 0:
            raise ValueError(f"Request {request.request_id!r} has an empty prompt.")
        if request.num_prompt_tokens > self.max_model_len:
            raise ValueError(
                f"Request {request.request_id!r} has {request.num_prompt_tokens} prompt "
                f"tokens, more than max_model_len={self.max_model_len}."
            )
        check_ever_fits(request, self.scheduler_config, self.kv_cache_manager, self.has_kv_cache)
        self.encoder.check_fits(request.request_id, request.mm_features)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        if request.is_pooling:
            self.pooling.add(request)
        else:
            self.waiting.add(request)

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
                self.pooling.remove(request)
            elif request.status == RequestStatus.RUNNING:
                finished.append(request)
            elif request.status == RequestStatus.SWAPPED:
                self.swapped.remove(request)
                self.swap_manager.free(request_id)
            elif self.remote_kv.holds(request):
                self.remote_kv.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)
        if finished:
            self._remove_from_running(finished)

    def _free_request(self, request: Request) -> None:
        assert request.is_finished()
        held = False
        if self.kv_connector is not None and self.has_kv_cache:
            held, request.kv_transfer_params = self.kv_connector.request_finished(
                request, self._get_block_ids(request.request_id)[0])
        if held:  # a peer pulls its blocks: they stay until pulled or their lease ends
            self.kv_sending[request.request_id] = request
        elif self.has_kv_cache:
            self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.trimmed_tables.pop(request.request_id, None)
        self.finished_request_ids.add(request.request_id)
        self.encoder.release_all(request.request_id, request.mm_features)

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
        plan = StepPlan(token_budget=self.scheduler_config.max_num_batched_tokens,
                        prefill_budget=self._prefill_cap())
        self.encoder.start_step()
        self._admit(self.pooling, plan)
        self.running = self.waiting.order_running(self.running)
        self.preemption.for_waiting(plan, self.running, lambda head: self._can_admit(head, plan))
        # (A preemption for a waiting request admits it: one step then.)
        plan.num_steps = self.multi_step.steps_for(
            self.running, lambda: bool(plan.preempted_ids) or self._admits_others()
        )
        if plan.num_steps > 1 and not self._group_fits(plan.num_steps):
            plan.num_steps = 1  # a group's lookahead slots never preempt a request
        self._schedule_running(plan)
        # After a preemption for space the cache is tight: admitting others now would only
        # thrash. A swap-in never shares a step with a swap-out (see sched_output.py).
        if plan.num_preempted_running == 0:
            if not plan.blocks_to_swap_out:
                self._admit(self.swapped_admission, plan)
            self._admit(self.remote_kv, plan)
            if len(self.remote_kv) > 1 and not self.running:
                self._restart_newest_loaded()
                self._admit(self.remote_kv, plan)
            self._admit(self.waiting_admission, plan)
        return self._make_output(plan)

    def _prefill_cap(self) -> int | None:
        """The step's cap on prefill tokens while requests decode (a long prefill beside
        decodes stretches every decoding request's inter-token gap):
        `prefill_tokens_per_decode` per decoding request, at least MIN_PREFILL_CHUNK, so
        the prefill's share grows with the decode step's own cost. None without decodes
        (a cold start or a lone long prompt prefills at the full budget)."""
        config = self.scheduler_config
        per_decode = config.prefill_tokens_per_decode
        if not per_decode or not config.enable_chunked_prefill:
            return None
        decoding = sum(1 for r in self.running if not is_prefill(r, r.num_computed_tokens))
        return max(MIN_PREFILL_CHUNK, per_decode * decoding) if decoding else None

    def _admits_others(self) -> bool:
        """Whether a request other than the running ones could start this step: one
        waits with a seat free, or a pooling, swapped or remote-KV request is queued."""
        seat_free = len(self.running) < self.scheduler_config.max_num_seqs
        return bool(
            (self.waiting and seat_free) or self.swapped or self.pooling or self.remote_kv
        )

    def _admit(self, queue: AdmissionQueue, plan: StepPlan) -> None:
        """Admit requests from `queue` in its order while seats and budget last and every
        check admits them (admission.py); passed-over requests keep their places."""
        passed_over: list[Request] = []
        try:
            while queue and plan.token_budget > 0 and self._has_seat(queue):
                request = queue.peek()
                probe = Candidate(request, 0)
                verdict = ask([*self.eligibility, *queue.checks], probe, plan)
                candidate = None
                if verdict is Verdict.ADMIT:
                    candidate = queue.candidate(request)
                    if candidate.load_is_async:  # parked while its KV loads
                        verdict = self._park(queue, candidate, plan)
                        if verdict is Verdict.ADMIT:
                            continue
                    else:
                        verdict = ask(self.capacity_checks, candidate, plan)
                if verdict is Verdict.SKIP and queue.passes_over:
                    passed_over.append(queue.pop())
                elif verdict is Verdict.FAIL:
                    self._fail_admission(queue.pop(), probe.fail_status)
                elif verdict is not Verdict.ADMIT:
                    break
                else:
                    assert candidate is not None
                    self._start(queue, candidate, plan)
        finally:
            if passed_over:
                queue.put_back(passed_over)

    def _has_seat(self, queue: AdmissionQueue) -> bool:
        return not queue.takes_seat or len(self.running) < self.scheduler_config.max_num_seqs

    def _start(self, queue: AdmissionQueue, candidate: Candidate, plan: StepPlan) -> None:
        """An admitted request runs this step (and takes its seat)."""
        request = queue.pop()
        queue.on_admit(candidate, plan)
        if candidate.encoder_plan is not None:
            self.encoder.commit(request.request_id, request.mm_features,
                                candidate.num_computed_tokens, candidate.encoder_plan)
        request.status = RequestStatus.RUNNING
        if queue.takes_seat:
            self.running.append(request)
        plan.add(request, candidate.num_new_tokens, candidate.new_block_ids, is_new=True)

    def _restart_newest_loaded(self) -> None:
        """Loaded requests hold blocks and none could grow, with nothing running to free
        any: the newest gives its blocks back and waits again, so the others can run."""
        request = self.remote_kv.ready[-1]
        self.remote_kv.remove(request)
        self._restart_without_remote_kv(request)

    def _restart_without_remote_kv(self, request: Request) -> None:
        """Back to the front of the waiting queue with no KV, to compute its prompt
        itself: its blocks go, and the connector offers it nothing again."""
        self.kv_cache_manager.free(request)
        self.kv_connector.load_failed(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_cached_tokens = None  # none were: counted again at its admission
        request.num_preemptions += 1
        self.waiting.prepend(request)

    def _park(self, queue: AdmissionQueue, candidate: Candidate, plan: StepPlan) -> Verdict:
        """A request whose KV a connector loads asynchronously gets blocks for it (out of
        the prefix cache until loaded) and waits in `remote_kv`, computing nothing: STOP
        when the blocks are not there."""
        request = candidate.request
        if self.kv_cache_manager.allocate_slots(
                request, candidate.num_external_tokens, candidate.computed_blocks,
                cache_new_blocks=False) is None:
            return Verdict.STOP
        queue.pop()
        queue.on_admit(candidate, plan)  # its tokens count as computed; the load planned
        self.remote_kv.park(request, candidate.num_computed_tokens
                            - candidate.num_external_tokens)
        return Verdict.ADMIT

    def _fail_admission(self, request: Request, status: RequestStatus) -> None:
        """End a request that can never run (a waiting one whose grammar did not compile:
        it holds no blocks)."""
        request.status = status
        self._free_request(request)

    def _group_fits(self, num_steps: int) -> bool:
        """Whether every running request's next token and its multi-step group's lookahead
        slots fit in the free blocks. A group that does not fit runs as one step, so grouping
        makes no preemption happen sooner than one step at a time would (a bfloat16 step's
        results depend on which requests share it)."""
        if not self.has_kv_cache:
            return True
        manager = self.kv_cache_manager
        lookahead = MultiStepPolicy.lookahead(num_steps)
        needed = sum(manager.get_num_blocks_to_grow(r, 1 + lookahead) for r in self.running)
        return needed <= manager.get_num_free_blocks()

    def _schedule_running(self, plan: StepPlan) -> None:
        """Give each running request its next tokens, preempting from the tail if needed."""
        index = 0
        share = -(-len(self.running) // self.num_concurrent_batches)  # ceil
        while (
            index < len(self.running) and plan.token_budget > 0
            and len(plan.cached_requests) < share
        ):
            request = self.running[index]
            num_new_tokens, encoder_plan = self._next_chunk(request, plan)
            if num_new_tokens == 0 or (
                self.lora_slots is not None and not self.lora_slots.fits(request, plan)
            ):
                # Nothing to compute now (or, unchunked, too little budget left; or its
                # adapter would be one too many this step).
                index += 1
                continue
            drafts = drafts_to_schedule(
                request, num_new_tokens, plan.token_budget, self.max_model_len
            )
            num_new_tokens += len(drafts)
            new_block_ids = self.preemption.allocate_or_preempt(
                request, num_new_tokens, plan, self.running,
                self._lookahead(request, num_new_tokens, request.num_computed_tokens)
                + MultiStepPolicy.lookahead(plan.num_steps),
            )
            if new_block_ids is None:
                # It preempted itself; being the tail, no running request is left after it.
                break
            if encoder_plan is not None:
                self.encoder.commit(request.request_id, request.mm_features,
                                    request.num_computed_tokens, encoder_plan)
            plan.add(request, num_new_tokens, new_block_ids, is_new=False, spec_token_ids=drafts)
            index += 1

    def _next_chunk(self, request: Request, plan: StepPlan) -> tuple[int, EncoderPlan | None]:
        """The tokens running `request` computes this step and its encoder plan: within
        the budget and the prefill cap, cut before an image the encoder cannot take (as
        a waiting request's chunk is: EncoderInputs.plan_chunk)."""
        start = request.num_computed_tokens
        num_new_tokens = self.token_budget.num_tokens(
            request, plan.budget_for(request, start), start
        )
        encoder_plan = None if num_new_tokens == 0 else self.encoder_inputs.plan_chunk(
            request, start, num_new_tokens, plan.token_budget
        )
        if encoder_plan is None:  # nothing to compute, or no encoder inputs
            return num_new_tokens, None
        return encoder_plan.num_new_tokens, encoder_plan

    def _can_admit(self, request: Request, plan: StepPlan) -> bool:
        """True if the waiting `request` would get a seat and blocks now."""
        if len(self.running) >= self.scheduler_config.max_num_seqs:
            return False
        blocks, num_cached = self.kv_cache_manager.get_computed_blocks(request)
        num_new_tokens = self.token_budget.num_tokens(
            request, plan.budget_for(request, num_cached), num_cached
        )
        num_lookahead = self._lookahead(request, num_new_tokens, num_cached)
        return num_new_tokens > 0 and self.kv_cache_manager.can_allocate(
            request, num_new_tokens + num_lookahead, blocks
        )

    def _forget_preempted(self, request: Request) -> None:
        """The worker must drop a preempted request's state: it comes back as a new one."""
        self.finished_request_ids.add(request.request_id)
        self.trimmed_tables.pop(request.request_id, None)
        self.encoder.release_all(request.request_id, request.mm_features)

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far."""
        return self.preemption.count

    def _make_output(self, plan: StepPlan) -> SchedulerOutput:
        """Package the plan for the worker, then advance `num_computed_tokens`."""
        output = plan.make_output(
            self._get_block_ids, self.finished_request_ids, self.trimmed_tables,
            self.send_token_ids,
        )
        self.finished_request_ids = set()
        if self.kv_connector is not None:
            # Only prompt blocks are saved: decoding requests need no copies of their tables.
            output.kv_connector_metadata = self.kv_connector.build_connector_meta(
                [self._scheduled_kv(r, plan) for r in plan.cached_requests + plan.new_requests
                 if r.num_computed_tokens < r.num_prompt_tokens])
        output.scheduled_encoder_inputs = self.encoder.scheduled
        output.num_steps = plan.num_steps if plan.runs_decodes_only() else 1
        output.free_encoder_mm_hashes = self.encoder.cache.take_freed()
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
            if request.mm_features:
                # Items computed past are released; the runner uses them in this step
                # still (an eviction reaches it with a later step).
                self.encoder.release_consumed(request.request_id, request.mm_features,
                                              request.num_computed_tokens)
        return output

    def _scheduled_kv(self, request: Request, plan: StepPlan) -> ScheduledKV:
        """A scheduled request as the KV connector sees it (before its tokens advance)."""
        return ScheduledKV(
            request.request_id, list(self.kv_cache_manager.block_hashes(request)),
            list(self._get_block_ids(request.request_id)[0]), request.num_computed_tokens,
            plan.num_scheduled_tokens[request.request_id], request.num_prompt_tokens,
            transfer_params(request))

    @property
    def kv_connector(self) -> Any:
        """The engine's KV connector's scheduler half (distributed/kv_transfer/), or None."""
        return self.waiting_admission.kv_connector

    @kv_connector.setter
    def kv_connector(self, connector: Any) -> None:
        self.waiting_admission.kv_connector = connector

    def _get_block_ids(self, request_id: str) -> BlockIds:
        if not self.has_kv_cache:
            return ()
        return self.kv_cache_manager.get_block_ids(request_id)

    # --------------------------------------------------------------------- after the step

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[tuple[Request, list[int]]]:
        """Append sampled tokens through the post-step processors and free requests that
        finished.

        Returns:
            For every request that got tokens or finished this step: the Request and the
            token ids appended this step (cut after a stop token). Requests aborted since
            `schedule()` are skipped.
        """
        results: list[tuple[Request, list[int]]] = []
        finished: list[Request] = []
        preemptions = self._in_flight.pop(id(scheduler_output), None)
        failed_ids = set(model_runner_output.failed_request_ids)
        kv_output = model_runner_output.kv_connector_output or _NO_TRANSFERS
        to_reload: list[Request] = []
        for request_id, token_ids in zip(
            model_runner_output.request_ids, model_runner_output.sampled_token_ids, strict=True
        ):
            request = self._still_scheduled(request_id, scheduler_output, preemptions)
            if request is None:
                continue
            if request_id in kv_output.failed_recving and self._recomputes_failed_loads:
                to_reload.append(request)  # computed over KV that did not load
                continue
            if request_id in failed_ids and token_ids:
                # A multi-step's steps before the failing one sampled these (one step at a
                # time would have sent them before the failure).
                appended = apply_processors(self.processors, request, token_ids, 0)
                if not request.is_finished():
                    self._fail(request)
            elif request_id in failed_ids or request_id in kv_output.failed_recving:
                self._fail(request)
                appended = []
            elif not token_ids:
                continue  # prompt still being prefilled in chunks
            else:
                drafts = scheduler_output.scheduled_spec_decode_tokens.get(request_id, [])
                appended = apply_processors(self.processors, request, token_ids, len(drafts))
            results.append((request, appended))
            if request.is_finished():
                finished.append(request)
            else:
                request.spec_token_ids = model_runner_output.spec_token_ids.get(request_id, [])
        for request in finished:
            self._free_request(request)
        if finished:
            self._remove_from_running(finished)
        for request in to_reload:
            self._recompute_after_failed_load(request)
        if kv_output is not _NO_TRANSFERS:
            results += self._apply_async_transfers(kv_output)
        pooled = self.pooling.finish_step(scheduler_output, model_runner_output.pooler_output)
        for request in pooled:
            self._free_request(request)
        return results + [(request, []) for request in pooled]

    @property
    def _recomputes_failed_loads(self) -> bool:
        """kv_load_failure_policy "recompute": a request whose KV failed to load computes
        it itself (else it fails)."""
        connector = self.kv_connector
        return connector is not None and connector.config.kv_load_failure_policy == "recompute"

    def _apply_async_transfers(self, kv_output: KVConnectorOutput
                               ) -> list[tuple[Request, list[int]]]:
        """Free the held blocks peers pulled; parked requests whose KV loaded may run; a
        parked request whose load failed fails or goes on from its own prefix. Returns the
        requests that failed."""
        for request_id in kv_output.finished_sending:
            held = self.kv_sending.pop(request_id, None)
            if held is not None:
                self.kv_cache_manager.free(held)
        for request_id in kv_output.finished_recving:
            self.remote_kv.loaded(request_id)
        failed: list[tuple[Request, list[int]]] = []
        retry = self._recomputes_failed_loads
        for request_id in kv_output.failed_recving:
            request = self.remote_kv.load_failed(request_id, retry)
            if request is None or retry:
                continue
            request.status = RequestStatus.FINISHED_ERROR
            self._free_request(request)
            failed.append((request, []))
        return failed

    def _recompute_after_failed_load(self, request: Request) -> None:
        """A running request computed this step over blocks that failed to load: those
        leave the prefix cache and it starts again."""
        self.kv_cache_manager.forget_cached_blocks(request)
        self._remove_from_running([request])
        self._forget_preempted(request)
        self._restart_without_remote_kv(request)

    def _still_scheduled(
        self, request_id: str, scheduler_output: SchedulerOutput,
        preemptions: dict[str, int] | None,
    ) -> Request | None:
        """The running request the output is for; None when it was aborted (and perhaps
        re-added) or preempted since `schedule()`."""
        request = self.requests.get(request_id)
        if (
            request is None
            or request.status != RequestStatus.RUNNING
            or request_id not in scheduler_output.num_scheduled_tokens
        ):
            return None
        if preemptions is not None and preemptions.get(request_id) != request.num_preemptions:
            return None  # preempted while the step was in flight (and scheduled again)
        return request

    def _fail(self, request: Request) -> None:
        """End a request whose forward went non-finite. The blocks only it holds leave the
        prefix cache: whatever they hold must not be served to a later request."""
        request.status = RequestStatus.FINISHED_ERROR
        if self.has_kv_cache:
            self.kv_cache_manager.forget_cached_blocks(request)

    def _trim(self, request: Request) -> None:
        """Free the blocks past the request's computed tokens; tell the worker next step."""
        num_kept = self.kv_cache_manager.trim(request)
        if num_kept is not None:
            self.trimmed_tables[request.request_id] = num_kept

    # ----------------------------------------------------------------------- inspection

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission (new, preempted by recompute, or waiting for a
        KV connector's load)."""
        return len(self.waiting) + len(self.remote_kv) + self.remote_kv.num_loading

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
        return scheduler_stats(self)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing done) while any request holds blocks."""
        return self.kv_cache_manager.reset_prefix_cache()

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting, running or swapped."""
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits, runs or is swapped out."""
        return bool(self.requests)

    def has_pending_kv_transfers(self) -> bool:
        """True while a KV connector loads KV for a parked request or a peer has yet to
        pull a finished request's blocks: steps go on (empty ones poll the transfers)."""
        return bool(self.remote_kv.num_loading or self.kv_sending)

    def has_finished_requests(self) -> bool:
        """True when the next `schedule()` will tell the worker to drop some requests."""
        return bool(self.finished_request_ids)

    def check_integrity(self) -> None:
        """Assert the scheduler's, the KV cache's and the swap space's invariants."""
        check_scheduler_integrity(self)
