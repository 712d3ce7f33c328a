"""AsyncLLM: the engine for asyncio callers (the OpenAI server). Many `generate` calls at once.

The engine core runs in a child process (`AsyncMPClient`, with `multiprocessing=True`, the
server's default) or in a background thread (`ThreadedCoreClient`); text handling stays here,
reusing LLMEngine's InputProcessor and OutputProcessor. One output-handler task routes each
step's RequestOutputs to per-request queues. A caller that stops iterating (a client that
disconnected, a cancelled task) has its request aborted and its KV blocks freed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

from pagedllm.config import EngineConfig, ModelConfig, for_online_serving
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.core_client import AsyncEngineCoreClient, AsyncMPClient
from pagedllm.engine.core_thread import ThreadedCoreClient
from pagedllm.engine.exceptions import EngineDeadError
from pagedllm.engine.input_processor import PromptType
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.protocol import EngineCoreOutputs
from pagedllm.logger import init_logger
from pagedllm.lora.request import LoRARequest
from pagedllm.metrics.loggers import LoggingStatLogger, PrometheusStatLogger
from pagedllm.metrics.request_timing import RequestTimingTracker
from pagedllm.metrics.stats import SchedulerStats
from pagedllm.outputs import CompletionOutput, PoolingRequestOutput, RequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams

logger = init_logger(__name__)

_Output = RequestOutput | PoolingRequestOutput
_QueueItem = _Output | BaseException


class AsyncLLM:
    """An engine shared by many concurrent asyncio callers.

    Example:
        engine = AsyncLLM.from_engine_args(EngineArgs(model=path))
        async for output in engine.generate("Hello", SamplingParams(max_tokens=8), "req-0"):
            print(output.outputs[0].text)

    Args:
        engine_config: the resolved engine configuration (the model loads here).
        log_stats: keep Prometheus metrics and log a throughput line periodically.
        model_name: the `model_name` label of the metrics (default: the model argument).
        multiprocessing: run the engine core in its own process (the model loads there);
            otherwise in a thread of this process.
    """

    def __init__(
        self, engine_config: EngineConfig, log_stats: bool = True, model_name: str | None = None,
        multiprocessing: bool = False,
    ) -> None:
        engine_config = for_online_serving(engine_config)
        self.engine_config = engine_config
        self._shut_down = False
        self.engine_core: AsyncEngineCoreClient = _make_client(engine_config, multiprocessing)
        try:
            self.engine = LLMEngine(engine_config, engine_core=self.engine_core)
        except BaseException:
            self.engine_core.shutdown()
            raise
        self._queues: dict[str, asyncio.Queue[_QueueItem]] = {}
        self._output_handler: asyncio.Task[None] | None = None
        self._timing = RequestTimingTracker()
        self._supports_priority = (
            "priority" in inspect.signature(self.engine.add_request).parameters
        )
        self.log_stats = log_stats
        self.logging_logger = LoggingStatLogger() if log_stats else None
        self.prometheus = self._make_prometheus(model_name) if log_stats else None

    @classmethod
    def from_engine_args(
        cls, engine_args: EngineArgs, log_stats: bool = True, model_name: str | None = None,
        multiprocessing: bool = False,
    ) -> AsyncLLM:
        """Resolve the arguments and build the engine."""
        return cls(engine_args.create_engine_config(), log_stats, model_name, multiprocessing)

    def _make_prometheus(self, model_name: str | None) -> PrometheusStatLogger:
        config = self.engine_config
        cache = config.cache_config
        labels = {
            "block_size": str(cache.block_size),
            "num_gpu_blocks": str(self.engine_core.num_gpu_blocks),
            "enable_prefix_caching": str(getattr(cache, "enable_prefix_caching", False)),
        }
        name = model_name or config.model_config.model
        return PrometheusStatLogger(name, config.model_config.max_model_len, labels)

    # ---------------------------------------------------------------------- public API

    def get_tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self.engine.tokenizer

    def get_model_config(self) -> ModelConfig:
        """The resolved model configuration."""
        return self.engine_config.model_config

    def check_health(self) -> None:
        """Raise EngineDeadError if the engine core stopped."""
        self.engine_core.check_health()

    async def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (every core's); False when requests held blocks."""
        return await self.engine_core.reset_prefix_cache_async()

    async def sleep(self, level: int = 1) -> None:
        """Give the KV cache (level 1) and the weights (level 2) back while idle (vLLM's
        sleep, mode "abort": running requests end with finish_reason "abort"). Requests
        that arrive meanwhile wait for `wake_up`."""
        await self.abort(list(self._queues))
        await asyncio.wrap_future(self.engine_core.call_utility("sleep", level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what `sleep` gave ("weights", "kv_cache"; None: both)."""
        await asyncio.wrap_future(self.engine_core.call_utility("wake_up", tags))

    async def is_sleeping(self) -> bool:
        """True while the engine sleeps."""
        return bool(await asyncio.wrap_future(self.engine_core.call_utility("is_sleeping")))

    @property
    def latest_scheduler_stats(self) -> SchedulerStats | None:
        """The scheduler's counts after the latest step (None before the first)."""
        return self.engine_core.latest_scheduler_stats

    @property
    def errored(self) -> bool:
        """True once the engine core died."""
        try:
            self.check_health()
        except EngineDeadError:
            return True
        return False

    def get_num_unfinished_requests(self) -> int:
        """User requests still running or waiting."""
        return len(self._queues)

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        priority: int = 0,
        add_special_tokens: bool = True,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream the request's RequestOutputs (in `sampling_params.output_kind`).

        Raises:
            ValueError: invalid prompt or parameters (nothing is queued then).
            EngineDeadError: the engine core stopped.
        """
        stream = await self.add_request(
            request_id, prompt, sampling_params, priority, add_special_tokens, lora_request
        )
        try:
            async for output in stream:
                yield cast("RequestOutput", output)
        finally:
            await stream.aclose()

    async def encode(
        self,
        prompt: PromptType,
        pooling_params: PoolingParams,
        request_id: str,
        add_special_tokens: bool = True,
    ) -> AsyncGenerator[PoolingRequestOutput, None]:
        """A pooling request's result: one PoolingRequestOutput (vLLM's `encode`).

        `pooling_params.task` says what is asked (embed, classify, score, encode, reward).

        Raises:
            ValueError: a task the model does not serve, or an invalid input.
            EngineDeadError: the engine core stopped.
        """
        stream = await self.add_request(request_id, prompt, pooling_params, 0, add_special_tokens)
        try:
            async for output in stream:
                yield cast("PoolingRequestOutput", output)
        finally:
            await stream.aclose()

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        """What the model serves: ("generate",), pooling tasks, or both."""
        return self.engine.supported_tasks

    async def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        sampling_params: SamplingParams | PoolingParams,
        priority: int = 0,
        add_special_tokens: bool = True,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[_Output, None]:
        """Validate and queue a request now; returns its output stream.

        Unlike `generate`, errors in the input surface here, before any output is awaited
        (the server answers them with a 400 before it starts a stream). The caller must
        iterate the stream to its end, or `abort` the request. An adapter not yet loaded
        with `add_lora` is loaded first (blocking: prefer `await add_lora(...)` beforehand).
        """
        self._start_output_handler()
        queue = self._add_request(
            request_id, prompt, sampling_params, priority, add_special_tokens, lora_request
        )
        return self._stream(request_id, queue)

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a LoRA adapter in the engine core (ValueError naming what is wrong)."""
        await asyncio.wrap_future(self.engine.start_add_lora(lora_request))
        return True

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Drop a LoRA adapter once its running requests finish (False: not loaded)."""
        return bool(await asyncio.wrap_future(self.engine.start_remove_lora(lora_int_id)))

    async def dashboard_snapshot(self) -> dict[str, Any]:
        """The engine core's counts, KV block map and request progress (the first core's,
        with several data-parallel cores)."""
        return dict(await asyncio.wrap_future(
            self.engine_core.call_utility("dashboard_snapshot")))

    async def list_loras(self) -> set[int]:
        """Ids of the LoRA adapters loaded in the engine core."""
        return set(await asyncio.wrap_future(self.engine_core.call_utility("list_loras")))

    async def _stream(
        self, request_id: str, queue: asyncio.Queue[_QueueItem]
    ) -> AsyncGenerator[_Output, None]:
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            # Cancelled, closed early or failed: free the request's blocks in the core.
            if self._queues.get(request_id) is queue:
                del self._queues[request_id]
            if not finished:
                self._abort(request_id)

    async def abort(self, request_id: str | list[str]) -> None:
        """Abort requests; their `generate` streams end with finish_reason "abort"."""
        request_ids = [request_id] if isinstance(request_id, str) else request_id
        for rid in request_ids:
            self._abort(rid)
            queue = self._queues.get(rid)
            if queue is not None:
                aborted = CompletionOutput(index=0, text="", token_ids=[], finish_reason="abort")
                queue.put_nowait(RequestOutput(rid, None, [], [aborted], finished=True))

    def shutdown(self) -> None:
        """Stop the output handler and the engine core (a second call does nothing)."""
        if self._output_handler is not None:
            self._output_handler.cancel()
            self._output_handler = None
        if not self._shut_down:
            self._shut_down = True
            self.engine_core.shutdown()

    # ---------------------------------------------------------------------- internals

    def _add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams,
        priority: int,
        add_special_tokens: bool,
        lora_request: LoRARequest | None = None,
    ) -> asyncio.Queue[_QueueItem]:
        self.engine_core.check_health()
        if request_id in self._queues:
            raise ValueError(f"Request id {request_id!r} is already running.")
        kwargs: dict[str, Any] = {"add_special_tokens": add_special_tokens}
        if lora_request is not None:
            kwargs["lora_request"] = lora_request
        if priority != 0:
            if not self._supports_priority:
                raise ValueError("priority is not supported yet: requests are served FCFS.")
            kwargs["priority"] = priority
        arrival = time.monotonic()
        self.engine.add_request(request_id, prompt, params, **kwargs)
        queue: asyncio.Queue[_QueueItem] = asyncio.Queue()
        self._queues[request_id] = queue
        processor = self.engine.output_processor
        state = processor.requests.get(request_id)
        num_prompt_tokens = len(state.prompt_token_ids) if state is not None else 0
        if isinstance(params, PoolingParams):
            num_prompt_tokens = len(processor.pooling_requests.get(request_id, ()))
            self._timing.add_request(request_id, arrival, num_prompt_tokens, 1, 0)
        else:
            self._timing.add_request(request_id, arrival, num_prompt_tokens, params.n,
                                     params.max_tokens)
        return queue

    def _abort(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self._record_finished(request_id, "abort")

    def _start_output_handler(self) -> None:
        if self._output_handler is None or self._output_handler.done():
            self._output_handler = asyncio.get_running_loop().create_task(
                self._run_output_handler(), name="pagedllm-output-handler"
            )

    async def _run_output_handler(self) -> None:
        try:
            while True:
                outputs = await self.engine_core.get_output_async()
                self._process_core_outputs(outputs)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - every waiter must hear about it
            logger.error("The output handler stopped: %r", error)
            dead = error if isinstance(error, EngineDeadError) else EngineDeadError(repr(error))
            for queue in self._queues.values():
                queue.put_nowait(dead)

    def _process_core_outputs(self, outputs: EngineCoreOutputs) -> None:
        now = time.monotonic()
        processor = self.engine.output_processor
        owners = getattr(processor, "sequence_owner", {})
        user_ids = [
            owners[o.request_id].request_id if o.request_id in owners else o.request_id
            for o in outputs.outputs
        ]
        wall_offset = time.time() - now  # the core stamps wall-clock times
        for user_id, core_output in zip(user_ids, outputs.outputs, strict=True):
            if core_output.first_scheduled_time is not None:
                scheduled = core_output.first_scheduled_time - wall_offset
                self._timing.observe_scheduled(user_id, scheduled)
        new_tokens = [
            (user_id, o.request_id, len(o.new_token_ids))
            for user_id, o in zip(user_ids, outputs.outputs, strict=True)
        ]
        iteration = self._timing.observe_tokens(new_tokens, now)
        request_outputs, to_abort = processor.process_outputs(outputs.outputs)
        self.engine_core.abort_requests(to_abort)
        for output in request_outputs:
            queue = self._queues.get(output.request_id)
            if queue is not None:
                queue.put_nowait(output)
            if isinstance(output, PoolingRequestOutput):
                self._record_finished(output.request_id, "stop", now)
            elif output.finished:
                reason = next((c.finish_reason for c in output.outputs if c.finish_reason), None)
                self._record_finished(output.request_id, reason or "stop", now)
        stats = getattr(outputs, "scheduler_stats", None) or self.engine_core.latest_scheduler_stats
        if self.prometheus is not None:
            if stats is not None:
                self.prometheus.record_scheduler(stats)
            self.prometheus.record_iteration(iteration)
        if self.logging_logger is not None:
            self.logging_logger.record(stats, iteration)

    def _record_finished(self, request_id: str, reason: str, now: float | None = None) -> None:
        sample = self._timing.finish_request(request_id, reason, now or time.monotonic())
        if sample is not None and self.prometheus is not None:
            self.prometheus.record_finished(sample)


def _make_client(engine_config: EngineConfig, multiprocessing: bool) -> AsyncEngineCoreClient:
    """The core in a process (several, load-balanced, for data parallelism) or a thread.

    Raises:
        ValueError: data parallelism without multiprocessing.
    """
    data_parallel_size = engine_config.parallel_config.data_parallel_size
    if data_parallel_size > 1:
        if not multiprocessing:
            raise ValueError(
                f"data_parallel_size={data_parallel_size} runs each engine core in its own "
                "process: it needs multiprocessing (the server's default)."
            )
        from pagedllm.engine.dp_client import DPAsyncMPClient

        return DPAsyncMPClient(engine_config)
    return AsyncMPClient(engine_config) if multiprocessing else ThreadedCoreClient(engine_config)


# vLLM's older name for the same class.
AsyncLLMEngine = AsyncLLM
