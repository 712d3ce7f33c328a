"""ThreadedCoreClient: the engine core's busy loop in a background thread, for asyncio callers.

The event loop enqueues add/abort messages; the core thread applies them, steps while any
request is unfinished and blocks on its input queue when idle, and hands every step's
outputs back to the event loop with `loop.call_soon_threadsafe`. Model execution therefore
never blocks the event loop. This module does no text processing and no HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import queue
import threading
from concurrent.futures import Future
from typing import Any

from pagedllm.config import EngineConfig
from pagedllm.engine.core import EngineCore
from pagedllm.engine.core_client import AsyncEngineCoreClient
from pagedllm.engine.exceptions import EngineDeadError
from pagedllm.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    UtilityRequest,
)
from pagedllm.engine.utility import run_utility, settle
from pagedllm.logger import init_logger
from pagedllm.metrics.stats import SchedulerStats
from pagedllm.request import FinishReason

logger = init_logger(__name__)

_JOIN_TIMEOUT_S = 10.0


class _Message(enum.Enum):
    ADD = enum.auto()
    ABORT = enum.auto()
    UTILITY = enum.auto()
    SHUTDOWN = enum.auto()


# What the core thread hands to the event loop: a step's outputs with the scheduler's stats,
# or the error that killed the core.
_Item = tuple[EngineCoreOutputs, SchedulerStats] | BaseException


class ThreadedCoreClient(AsyncEngineCoreClient):
    """Runs an `EngineCore` in a daemon thread; see the module docstring for the protocol.

    Args:
        engine_config: the engine to build (the model loads in the constructor).
    """

    def __init__(self, engine_config: EngineConfig) -> None:
        self.engine_core = EngineCore(engine_config)
        self._inputs: queue.SimpleQueue[tuple[_Message, Any]] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outputs: asyncio.Queue[_Item] | None = None
        self._error: BaseException | None = None
        self._last_stats: SchedulerStats | None = None
        # The SchedulerStats that came with the last output handed to the event loop.
        self.latest_scheduler_stats: SchedulerStats | None = None
        self._thread = threading.Thread(
            target=self._run_busy_loop, name="pagedllm-engine-core", daemon=True
        )
        self._thread.start()

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks of the core."""
        return self.engine_core.executor.kv_cache_spec.num_blocks

    # ------------------------------------------------------------------ event-loop side

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # First use, or a new event loop (e.g. successive asyncio.run calls in tests).
            self._loop = loop
            self._outputs = asyncio.Queue()

    def add_request(self, request: EngineCoreRequest) -> None:
        """Enqueue a request for the core thread (never blocks)."""
        self.check_health()
        self._bind_loop()
        self._inputs.put((_Message.ADD, request))

    def abort_requests(self, request_ids: list[str]) -> None:
        """Enqueue an abort; the core frees the requests' blocks on its next turn."""
        if request_ids and self._error is None:
            self._inputs.put((_Message.ABORT, list(request_ids)))

    def call_utility(self, method: str, *args: Any) -> Future[Any]:
        """Run a core method on the core thread between steps; its future result."""
        self.check_health()
        future: Future[Any] = Future()
        self._inputs.put((_Message.UTILITY, (UtilityRequest(0, method, list(args)), future)))
        return future

    async def get_output_async(self) -> EngineCoreOutputs:
        """The next step's outputs; raises EngineDeadError once the core died."""
        self._bind_loop()
        assert self._outputs is not None
        item = await self._outputs.get()
        if isinstance(item, BaseException):
            raise item
        outputs, stats = item
        self.latest_scheduler_stats = stats
        return outputs

    def check_health(self) -> None:
        """Raise EngineDeadError when the core thread crashed or was shut down."""
        if self._error is not None:
            raise EngineDeadError(f"The engine core died: {self._error!r}")
        if not self._thread.is_alive():
            raise EngineDeadError("The engine core is not running (it was shut down).")

    def shutdown(self) -> None:
        """Stop the core thread and release the executor."""
        if self._thread.is_alive():
            self._inputs.put((_Message.SHUTDOWN, None))
            self._thread.join(_JOIN_TIMEOUT_S)
        self.engine_core.shutdown()

    # --------------------------------------------------------------------- core thread

    def _run_busy_loop(self) -> None:
        try:
            while self._process_inputs(block=not self._has_work()):
                if self._has_work():
                    self._deliver(self.engine_core.step())
        except BaseException as error:  # noqa: BLE001 - any crash kills the engine
            logger.exception("The engine core crashed.")
            self._error = error
            self._post(EngineDeadError(f"The engine core died: {error!r}"))
        self._fail_pending_calls()

    def _fail_pending_calls(self) -> None:
        """Utility calls still queued when the loop ended get an error, not a hang."""
        while True:
            try:
                kind, payload = self._inputs.get_nowait()
            except queue.Empty:
                return
            if kind is _Message.UTILITY:
                payload[1].set_exception(EngineDeadError("The engine core is not running."))

    def _has_work(self) -> bool:
        return self.engine_core.can_step()

    def _process_inputs(self, block: bool) -> bool:
        """Apply every queued message (waiting for one if `block`); False on shutdown."""
        try:
            message = self._inputs.get(block=block)
        except queue.Empty:
            return True
        while True:
            kind, payload = message
            if kind is _Message.SHUTDOWN:
                return False
            if kind is _Message.ADD:
                self._add(payload)
            elif kind is _Message.UTILITY:
                call, future = payload
                settle(future, run_utility(self.engine_core, call))
            else:
                self.engine_core.abort_requests(payload)
            try:
                message = self._inputs.get_nowait()
            except queue.Empty:
                return True

    def _add(self, request: EngineCoreRequest) -> None:
        try:
            self.engine_core.add_request(request)
        except ValueError as error:
            # The frontend validated it; a request the scheduler still refuses ends here.
            logger.warning("Request %s refused by the scheduler: %s", request.request_id, error)
            refused = EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.ABORT)
            self._deliver(EngineCoreOutputs(outputs=[refused]))

    def _deliver(self, outputs: EngineCoreOutputs) -> None:
        stats = getattr(outputs, "scheduler_stats", None) or self._read_stats()
        if not outputs.outputs and stats == self._last_stats:
            return  # an idle turn that changed nothing
        self._last_stats = stats
        self._post((outputs, stats))

    def _read_stats(self) -> SchedulerStats:
        # Used while the core's outputs do not carry scheduler_stats themselves.
        scheduler = self.engine_core.scheduler
        return SchedulerStats(
            num_running_reqs=scheduler.num_running,
            num_waiting_reqs=scheduler.num_waiting,
            kv_cache_usage=scheduler.kv_cache_usage,
            num_preemptions=scheduler.num_preemptions,
        )

    def _post(self, item: _Item) -> None:
        loop, outputs = self._loop, self._outputs
        if loop is None or outputs is None:
            return  # nobody is listening yet
        # RuntimeError: the event loop closed, so nobody will read this any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(outputs.put_nowait, item)
