"""EngineCore: the synchronous heart of the engine. Token ids in, token ids out.

`step()` is schedule → execute → update. It owns the Scheduler and the Executor and never
sees text. Wrapped in-process by `InprocClient` (offline `LLM`); a process wrapper reuses it.

With pipeline stages (`executor.max_concurrent_batches` > 1, vLLM's virtual engines) a step
launches a batch while there is room and something to run, and otherwise finishes the
oldest batch in flight, so every stage has work.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any, cast

import cloudpickle

from pagedllm.config import EngineConfig
from pagedllm.core.kv_cache_groups import KVCacheCapacity
from pagedllm.core.kv_events import KVEventRecorder
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.snapshot import scheduler_snapshot
from pagedllm.distributed.kv_transfer import KVConnectorRole, make_connector
from pagedllm.engine.kv_events_publisher import ZmqEventPublisher
from pagedllm.engine.protocol import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from pagedllm.executor import make_executor
from pagedllm.logger import init_logger
from pagedllm.lora.request import LoRARequest
from pagedllm.metrics.stats import KVTransferCounts, SchedulerStats
from pagedllm.request import Request
from pagedllm.structured_output import StructuredOutputManager
from pagedllm.tokenizer.tokenizer import get_tokenizer
from pagedllm.worker.outputs import ModelRunnerOutput

logger = init_logger(__name__)
# How often an idle engine polls a KV connector's transfers (a parked load, a held send).
_TRANSFER_POLL_SECONDS = 0.002


class EngineCore:
    """Schedules requests and runs the model, one step at a time."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.config = engine_config
        self.executor = make_executor(engine_config)
        try:
            self._init_scheduler(engine_config)
        except BaseException:
            self.executor.shutdown()
            raise
        # Batches in flight (pipeline parallel), oldest first.
        self._batch_queue: deque[tuple[SchedulerOutput, Future[Any]]] = deque()
        # Batches launched while another was in flight (the stages overlapped).
        self.num_overlapped_batches = 0

    def _init_scheduler(self, engine_config: EngineConfig) -> None:
        spec = self.executor.kv_cache_spec
        self.model_execute_seconds = 0.0  # busy time of the model runner, cumulative
        self.scheduler = Scheduler(
            engine_config.scheduler_config,
            engine_config.cache_config,
            KVCacheCapacity(spec.num_blocks, spec.num_cpu_blocks, spec.groups),
            lora_config=engine_config.lora_config,
            speculative_config=engine_config.speculative_config,
            parallel_config=engine_config.parallel_config,
        )
        self._check_kv_capacity()
        self._loras_to_remove: set[int] = set()  # asked to go, waiting for their requests
        self._kv_events, self.kv_event_publisher = self._start_kv_events(engine_config)
        self.sleeping = False  # sleep mode: the workers gave memory back
        self.kv_transfer_totals = KVTransferCounts()  # a KV connector's traffic, cumulative
        if engine_config.kv_transfer_config is not None:  # the connector's scheduler half
            spec = self.executor.kv_cache_spec
            self.scheduler.kv_connector = make_connector(
                engine_config.kv_transfer_config, KVConnectorRole.SCHEDULER, spec.block_size,
                spec.bytes_per_block)
        model_config = engine_config.model_config
        self.structured_output = StructuredOutputManager(
            lambda: get_tokenizer(model_config.model_dir, model_config.gguf_file),
            model_config.text_config.vocab_size,
            engine_config.structured_outputs_config.resolved_backend,
            reasoning_parser=engine_config.structured_outputs_config.reasoning_parser,
            enable_in_reasoning=engine_config.structured_outputs_config.enable_in_reasoning,
        )

    def _start_kv_events(
        self, engine_config: EngineConfig
    ) -> tuple[KVEventRecorder | None, ZmqEventPublisher | None]:
        """The block pool's event recorder and the ZMQ publisher, when events are asked for
        and the prefix cache (which makes them) is on."""
        config = engine_config.kv_events_config
        if config is None or not config.enable_kv_cache_events:
            return None, None
        if not engine_config.cache_config.enable_prefix_caching:
            logger.warning("KV cache events are on but prefix caching is off: none are made.")
            return None, None
        recorder = self.scheduler.kv_cache_manager.enable_kv_events()
        return recorder, ZmqEventPublisher(config) if config.publishes else None

    def _check_kv_capacity(self) -> None:
        # Block 0 is the null block; one request must always fit alone or it could never run.
        if not self.scheduler.has_kv_cache:
            return  # an encoder: nothing is cached
        manager = self.scheduler.kv_cache_manager
        max_model_len = self.config.model_config.max_model_len
        num_needed = manager.get_num_blocks_needed(max_model_len)
        if num_needed > manager.num_usable_blocks:
            raise ValueError(
                f"The model's max_model_len ({max_model_len}) needs {num_needed} KV blocks "
                f"but the cache holds {manager.num_usable_blocks} (of {manager.block_size} "
                "tokens). Raise kv_cache_memory_bytes (or num_gpu_blocks_override), or lower "
                "max_model_len."
            )

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a tokenized request (a constrained one's grammar starts compiling)."""
        data = request.data
        core_request = Request(
            request.request_id, data, arrival_time=request.arrival_time,
            priority=request.priority,
        )
        params = data.sampling_params
        if params.structured_outputs is not None and data.pooling_params is None:
            stop_ids = [data.eos_token_id] if data.eos_token_id is not None else []
            core_request.structured_output = self.structured_output.grammar_for(
                params.structured_outputs, stop_ids + list(params.stop_token_ids or []),
                data.prompt_token_ids,
            )
        self.scheduler.add_request(core_request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Stop requests wherever they are and free their KV blocks."""
        self.scheduler.abort_requests(request_ids)
        if self._loras_to_remove:
            self._drop_unused_loras()

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs (or a batch is in flight)."""
        return bool(self._batch_queue) or self.scheduler.has_unfinished_requests()

    def dashboard_snapshot(self) -> dict[str, Any]:
        """The scheduler's counts, KV block map and request progress (core/snapshot.py)."""
        return scheduler_snapshot(self.scheduler)

    def add_lora(self, lora_name: str, lora_int_id: int, lora_path: str) -> bool:
        """Load a LoRA adapter now, so requests naming it start at once (vLLM's add_lora).

        Raises:
            ValueError: LoRA is off, or the adapter is missing, unsupported or made for
                another model (naming what).
        """
        self._loras_to_remove.discard(lora_int_id)
        self.executor.add_lora(LoRARequest(lora_name, lora_int_id, lora_path))
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop a LoRA adapter once no unfinished request uses it (those finish first).

        Returns False when no worker held it.
        """
        if lora_int_id not in self.executor.list_loras():
            return False
        self._loras_to_remove.add(lora_int_id)
        self._drop_unused_loras()
        return True

    def list_loras(self) -> list[int]:
        """Ids of the loaded LoRA adapters (those being removed excluded)."""
        return [i for i in self.executor.list_loras() if i not in self._loras_to_remove]

    def _drop_unused_loras(self) -> None:
        """Remove the adapters asked to go that no unfinished request runs any more."""
        in_use = {
            request.lora_request.lora_int_id
            for request in self.scheduler.requests.values()
            if request.lora_request is not None
        }
        for lora_id in sorted(self._loras_to_remove - in_use):
            self.executor.remove_lora(lora_id)
            self._loras_to_remove.discard(lora_id)

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, and report new tokens and finished requests (nothing
        while asleep)."""
        if self.sleeping:
            return EngineCoreOutputs()
        outputs = self._step()
        self._publish_kv_events()
        return outputs

    def _add_kv_transfer(self, counts: KVTransferCounts | None) -> None:
        """A step's KV connector traffic into the cumulative totals."""
        if counts is not None:
            # The totals keep sums, not every step's samples (the step's stats carry them).
            self.kv_transfer_totals.add(KVTransferCounts(
                counts.bytes_received, counts.bytes_sent, counts.failures))

    def make_stats(self) -> SchedulerStats:
        """The scheduler's stats with the core's cumulative counters (model time, a KV
        connector's traffic): what every stats message carries."""
        stats = self.scheduler.make_stats()
        stats.model_execute_seconds = self.model_execute_seconds
        totals = self.kv_transfer_totals
        stats.kv_transfer_bytes_received = totals.bytes_received
        stats.kv_transfer_bytes_sent = totals.bytes_sent
        stats.kv_transfer_failures = totals.failures
        return stats

    def _publish_kv_events(self) -> None:
        """Send the KV cache events since the last call, as one batch (if any)."""
        if self._kv_events is None:
            return
        events = self._kv_events.take()
        if events and self.kv_event_publisher is not None:
            self.kv_event_publisher.publish(events)

    def _step(self) -> EngineCoreOutputs:
        if self.executor.max_concurrent_batches > 1:
            return self._step_with_batch_queue()
        scheduler = self.scheduler
        # A step with only finished requests still tells the worker to drop their state.
        if not (scheduler.has_unfinished_requests() or scheduler.has_finished_requests()
                or scheduler.has_pending_kv_transfers()):
            return EngineCoreOutputs()
        scheduler_output = self.scheduler.schedule()
        self._add_grammar_bitmask(scheduler_output)
        start = time.perf_counter()
        model_output = self.executor.execute_model(scheduler_output)
        if scheduler_output.is_empty and scheduler.has_pending_kv_transfers():
            # Only a KV connector's transfers are under way: poll them, no busy spin (the
            # process sends nothing while its stats do not change).
            time.sleep(_TRANSFER_POLL_SECONDS)
        else:
            self.model_execute_seconds += time.perf_counter() - start
        return self._finish_step(scheduler_output, model_output)

    def _step_with_batch_queue(self) -> EngineCoreOutputs:
        """Launch a batch while there is room and something to compute; otherwise (or when
        the queue is full) wait for the oldest batch and report it."""
        scheduler, queue = self.scheduler, self._batch_queue
        if len(queue) < self.executor.max_concurrent_batches and (
            scheduler.has_unfinished_requests() or scheduler.has_finished_requests()
        ):
            scheduler_output = scheduler.schedule()
            if not scheduler_output.is_empty or scheduler_output.finished_request_ids:
                self._add_grammar_bitmask(scheduler_output)
                self.num_overlapped_batches += bool(queue)
                queue.append(
                    (scheduler_output, self.executor.execute_model_async(scheduler_output))
                )
                if not scheduler_output.is_empty:
                    return EngineCoreOutputs(scheduler_stats=self.make_stats())
        if not queue:
            return EngineCoreOutputs()
        scheduler_output, future = queue.popleft()
        start = time.perf_counter()
        model_output = future.result()
        self.model_execute_seconds += time.perf_counter() - start
        return self._finish_step(scheduler_output, model_output)

    def _finish_step(
        self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        """Apply a step's model output; the new tokens and finished requests."""
        updates = self.scheduler.update_from_output(scheduler_output, model_output)
        if self._loras_to_remove:
            self._drop_unused_loras()
        self._add_kv_transfer(model_output.kv_transfer)
        stats = self.make_stats()
        if model_output.kv_transfer is not None:
            stats.kv_transfer_seconds = list(model_output.kv_transfer.seconds)
        return EngineCoreOutputs(
            outputs=[
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=new_token_ids,
                    finish_reason=request.get_finished_reason(),
                    stop_reason=request.stop_reason,
                    # Logprobs go from the runner to the frontend by request id, beside the
                    # scheduler: it needs only the token ids.
                    new_logprobs=model_output.logprobs.get(request.request_id),
                    new_prompt_logprobs=model_output.prompt_logprobs.get(request.request_id),
                    pooling_output=model_output.pooler_output.get(request.request_id),
                    kv_transfer_params=request.kv_transfer_params,
                    **_first_output_facts(request, new_token_ids),
                )
                for request, new_token_ids in updates
            ],
            scheduler_stats=stats,
        )

    def _add_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        """The allowed tokens of every constrained request that samples this step."""
        if not self.structured_output.in_use:
            return
        requests = self.scheduler.requests
        sampling = [
            requests[request_id]
            for request_id in scheduler_output.num_scheduled_tokens
            if requests[request_id].structured_output is not None
            # Drafts count as computed: >= covers a request that verifies some.
            and requests[request_id].num_computed_tokens >= requests[request_id].num_tokens
        ]
        if not sampling:
            return
        scheduler_output.structured_output_request_ids = [r.request_id for r in sampling]
        drafts = scheduler_output.scheduled_spec_decode_tokens
        scheduler_output.grammar_bitmask = self.structured_output.grammar_bitmask(
            [r.structured_output for r in sampling],
            [drafts.get(r.request_id, []) for r in sampling],
        )

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block; False (nothing done) while requests hold blocks."""
        done = self.scheduler.reset_prefix_cache()
        self._publish_kv_events()
        return done

    # ------------------------------------------------------------------ sleep mode

    def sleep(self, level: int = 1) -> None:
        """Give the KV cache (level 1) and the weights (level 2) back while idle; requests
        added meanwhile wait for `wake_up`. ValueError while requests run."""
        if not self.config.model_config.enable_sleep_mode:
            raise ValueError("Sleep mode is off: start the engine with enable_sleep_mode=True "
                             "(--enable-sleep-mode).")
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}.")
        if self.has_unfinished_requests() or self.scheduler.has_pending_kv_transfers():
            raise ValueError("The engine cannot sleep while requests run (or a KV "
                             "connector's peer has yet to pull blocks): wait for them or "
                             "abort them first.")
        self.scheduler.reset_prefix_cache()  # the cache's contents are given back too
        self._publish_kv_events()
        self.executor.collective_rpc("sleep", level)
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what `sleep` gave ("weights", "kv_cache"; None: both); scheduling
        resumes once nothing is left asleep."""
        self.executor.collective_rpc("wake_up", tags)
        self.sleeping = any(self.executor.collective_rpc("is_sleeping"))

    def is_sleeping(self) -> bool:
        """True between `sleep` and the `wake_up` that takes everything back."""
        return self.sleeping

    def can_step(self) -> bool:
        """Whether a step has anything to do (nothing while asleep: requests wait)."""
        if self.sleeping:
            return False
        return (self.has_unfinished_requests() or self.scheduler.has_finished_requests()
                or self.scheduler.has_pending_kv_transfers())

    def collective_rpc(self, payload: bytes) -> bytes:
        """Run an encoded call (utils/rpc.py `encode_rpc`) on every worker, between
        steps; their results, pickled, in rank order."""
        return cast(bytes, cloudpickle.dumps(self.executor.collective_rpc("run_rpc", payload)))

    def shutdown(self) -> None:
        """Release the executor, the grammar compile threads and the events publisher."""
        self.structured_output.shutdown()
        if self.kv_event_publisher is not None:
            self.kv_event_publisher.shutdown()
        self.executor.shutdown()


def _first_output_facts(request: Request, new_token_ids: list[int]) -> dict[str, Any]:
    """What the frontend learns once, with a request's first output (its first tokens, or a
    pooling request's only output)."""
    if request.num_output_tokens > len(new_token_ids):
        return {}
    return {
        "num_cached_tokens": request.num_cached_tokens,
        "first_scheduled_time": request.first_scheduled_time,
    }
