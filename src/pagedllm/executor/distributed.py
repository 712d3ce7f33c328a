"""DistributedExecutor: what the "mp" and "ray" executors share.

The engine core's thread publishes (steps, method calls, shutdown) on the broadcast
channel; a receiver thread collects the answers, resolving each step's future in the order
the steps were sent and each method call once every rank answered. While nothing comes it
asks the subclass which workers are gone: a dead worker, or one that reported a failure,
fails every pending and later call with a `WorkerFailedError` naming the rank, within a
fraction of a second. Subclasses start, watch and stop the workers.
"""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401  (its exit hook must register before ours)
import threading
import time
from abc import abstractmethod
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from pagedllm.executor.abstract import Executor
from pagedllm.executor.channels import (
    ERROR,
    EXECUTE,
    FATAL,
    OUTPUT,
    RPC,
    SHUTDOWN,
    ExecutorChannels,
    Response,
)
from pagedllm.logger import init_logger

if TYPE_CHECKING:
    from pagedllm.config import EngineConfig
    from pagedllm.core.sched_output import SchedulerOutput
    from pagedllm.worker.outputs import ModelRunnerOutput
    from pagedllm.worker.worker import KVCacheSpec

logger = init_logger(__name__)

_POLL_MS = 100  # how often the receiver checks the workers while no answer comes
_SUBSCRIBE_TIMEOUT_MS = 60_000
# After a worker reports a failure: how long to look for a dead peer, the likelier cause
# (a rank blocked in a collective fails when its peer dies).
_FAILURE_GRACE_S = 1.0

# Set when the interpreter exits: the workers of an engine nobody shut down then leave with
# it (multiprocessing stops its children at exit), which is no failure to report. Registered
# after multiprocessing's own exit hook (imported above), so it runs first.
_INTERPRETER_EXITING = threading.Event()
atexit.register(_INTERPRETER_EXITING.set)


class WorkerFailedError(RuntimeError):
    """A worker rank died or failed; the engine cannot go on."""


class _RpcCall:
    """A method call on every rank: its future and the answers so far."""

    def __init__(self, world_size: int) -> None:
        self.future: Future[list[Any]] = Future()
        self.results: dict[int, Any] = {}
        self.errors: dict[int, str] = {}
        self.world_size = world_size

    def add(self, response: Response) -> bool:
        """Record one rank's answer; True once every rank answered (and the future set)."""
        if response.kind == ERROR:
            self.errors[response.rank] = response.payload
        else:
            self.results[response.rank] = response.payload
        if len(self.results) + len(self.errors) < self.world_size:
            return False
        if self.errors:
            self.future.set_exception(ValueError(self.errors[min(self.errors)]))
        else:
            self.future.set_result([self.results[rank] for rank in range(self.world_size)])
        return True


class DistributedExecutor(Executor):
    """Workers over the broadcast channel, one per rank; see the module docstring."""

    def __init__(self, engine_config: EngineConfig) -> None:
        parallel = engine_config.parallel_config
        self.config = engine_config
        self.world_size = parallel.world_size
        self.max_concurrent_batches = parallel.pipeline_parallel_size
        self._steps: deque[Future[Any]] = deque()
        self._calls: deque[_RpcCall] = deque()
        self._lock = threading.Lock()  # the deques: the core's thread and the receiver
        self._error: WorkerFailedError | None = None
        self._closing = False
        self.channels = ExecutorChannels(*self._channel_addresses())
        try:
            specs = self._start_workers()
            if not self.channels.wait_subscribed(self.world_size, _SUBSCRIBE_TIMEOUT_MS):
                raise WorkerFailedError("The workers did not connect to the executor.")
        except BaseException:
            self._stop()
            raise
        self.kv_cache_spec = specs[0]
        self._receiver = threading.Thread(
            target=self._run_receiver, name="pagedllm-executor-receiver", daemon=True
        )
        self._receiver.start()

    # ------------------------------------------------------------------ subclasses

    @abstractmethod
    def _channel_addresses(self) -> tuple[str, str]:
        """(broadcast, response) addresses to bind ("tcp://HOST:0" for a free port)."""

    @abstractmethod
    def _start_workers(self) -> list[KVCacheSpec]:
        """Start every rank (connecting to `self.channels`); their KV cache specs."""

    @abstractmethod
    def _dead_workers(self) -> dict[int, str]:
        """Rank -> why, for every worker that is gone."""

    @abstractmethod
    def _stop_workers(self) -> None:
        """Make sure every worker is gone (after the shutdown message, or without it)."""

    # ------------------------------------------------------------------ the interface

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on every rank; the driver's output."""
        return self.execute_model_async(scheduler_output).result()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Future[Any]:
        """Publish one step; its future output (raises WorkerFailedError if a rank fails)."""
        future: Future[Any] = Future()
        with self._lock:
            if self._error is not None:
                future.set_exception(self._error)
                return future
            self._steps.append(future)
        self.channels.publish(EXECUTE, scheduler_output)
        return future

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Call a Worker method on every rank; the results in rank order."""
        call = _RpcCall(self.world_size)
        with self._lock:
            if self._error is not None:
                raise self._error
            self._calls.append(call)
        self.channels.publish(RPC, method, list(args))
        return call.future.result()

    def check_health(self) -> None:
        """Raise WorkerFailedError once a rank failed."""
        if self._error is not None:
            raise self._error

    def shutdown(self) -> None:
        """Ask the workers to leave, then make sure they did."""
        if self._closing:
            return
        self._closing = True  # first: workers leaving is no failure now
        if self._error is None:
            self.channels.publish(SHUTDOWN)
        self._receiver.join(timeout=5)
        self._stop()
        if self._error is None:
            self._fail(WorkerFailedError("The executor was shut down."))

    def _stop(self) -> None:
        self._closing = True
        try:
            self._stop_workers()
        finally:
            self.channels.close()

    # ------------------------------------------------------------------ the receiver

    def _run_receiver(self) -> None:
        while not self._closing:
            response = self.channels.receive(_POLL_MS)
            if response is None:
                dead = self._dead_workers()
                if dead and not self._closing and not _INTERPRETER_EXITING.is_set():
                    self._fail(_describe(dead))
                    return
            elif response.kind == FATAL:
                self._fail(self._failure_of(response))
                return
            else:
                self._accept(response)

    def _accept(self, response: Response) -> None:
        with self._lock:
            if response.kind == OUTPUT:
                self._steps.popleft().set_result(response.payload)
            elif self._calls and self._calls[0].add(response):
                self._calls.popleft()

    def _failure_of(self, response: Response) -> WorkerFailedError:
        """The error for a rank's reported failure: a dead peer when there is one (the
        reporting rank may only have lost its collective partner)."""
        deadline = time.monotonic() + _FAILURE_GRACE_S
        while time.monotonic() < deadline:
            dead = self._dead_workers()
            if dead.keys() - {response.rank}:
                return _describe({r: why for r, why in dead.items() if r != response.rank})
            time.sleep(0.05)
        return WorkerFailedError(f"Worker rank {response.rank} failed:\n{response.payload}")

    def _fail(self, error: WorkerFailedError) -> None:
        if not self._closing:
            logger.error("%s", error)
        with self._lock:
            self._error = error
            pending = [*self._steps, *(call.future for call in self._calls)]
            self._steps.clear()
            self._calls.clear()
        for future in pending:
            if not future.done():
                future.set_exception(error)


def _describe(dead: dict[int, str]) -> WorkerFailedError:
    """The error naming the dead ranks."""
    parts = "; ".join(f"worker rank {rank} {why}" for rank, why in sorted(dead.items()))
    return WorkerFailedError(f"A worker is gone: {parts}. The engine cannot go on.")
