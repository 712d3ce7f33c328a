"""EngineCoreClient: how the frontend talks to the engine core.

One interface, several transports: `InprocClient` (the core in this process, used by the
offline `LLM`), `ThreadedCoreClient` (`core_thread.py`: a thread beside an event loop, the
server's `--no-multiprocessing` mode), and the multi-process clients `SyncMPClient` (opt-in
for `LLMEngine`) and `AsyncMPClient` (the server's default), which start `core_proc.py` in a
spawned child and talk to it over ZMQ `ipc://` sockets in a private temporary folder.

A multi-process client watches its child: a receiver thread polls the output socket and, when
nothing comes, whether the child is alive, so a dead core fails every waiter with
EngineDeadError within a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import queue
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any

import msgspec
import zmq

from pagedllm.config import EngineConfig
from pagedllm.engine.core import EngineCore
from pagedllm.engine.exceptions import EngineDeadError, EngineStartupError
from pagedllm.engine.protocol import (
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreRequestType,
    UtilityRequest,
)
from pagedllm.engine.serial import CoreOutputsDecoder, CoreRequestEncoder
from pagedllm.engine.utility import run_utility, settle
from pagedllm.logger import init_logger
from pagedllm.metrics.stats import SchedulerStats

logger = init_logger(__name__)

_POLL_MS = 200  # how often the receiver checks the child while no output comes
_STARTUP_POLL_S = 0.5
_STOP_TIMEOUT_S = 10.0


class EngineCoreClient(ABC):
    """Frontend-side handle on an engine core."""

    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None:
        """Send a request to the core."""

    @abstractmethod
    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests in the core."""

    @abstractmethod
    def get_output(self) -> EngineCoreOutputs:
        """Outputs of the next step (runs it, in-process)."""

    @abstractmethod
    def call_utility(self, method: str, *args: Any) -> Future[Any]:
        """Call an EngineCore method (engine/utility.py) between steps; its future result
        (ValueError for bad input)."""

    def shutdown(self) -> None:  # noqa: B027 - an optional hook: most transports hold nothing
        """Stop the core."""


class InprocClient(EngineCoreClient):
    """The core in this process: `get_output` runs one `step()` directly."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.engine_core = EngineCore(engine_config)

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue the request in the core's scheduler."""
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort in the core and free blocks at once."""
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def get_output(self) -> EngineCoreOutputs:
        """Run one step."""
        return self.engine_core.step()

    def reset_prefix_cache(self) -> bool:
        """Forget the core's cached KV blocks (False while requests hold blocks)."""
        return self.engine_core.reset_prefix_cache()

    def call_utility(self, method: str, *args: Any) -> Future[Any]:
        """Run the core method now (this is the core's thread); a completed future."""
        future: Future[Any] = Future()
        settle(future, run_utility(self.engine_core, UtilityRequest(0, method, list(args))))
        return future

    def shutdown(self) -> None:
        """Release the core's executor."""
        self.engine_core.shutdown()


class AsyncEngineCoreClient(EngineCoreClient):
    """A core that runs beside the caller's event loop (a thread today, a process later).

    Contract: `add_request` and `abort_requests` only enqueue and return at once (safe to call
    from the event loop); outputs of every step are awaited with `get_output_async`, in step
    order. When the core dies, `get_output_async` and `check_health` raise `EngineDeadError`.
    """

    def get_output(self) -> EngineCoreOutputs:
        """Not available: the core steps on its own; await `get_output_async` instead."""
        raise NotImplementedError("An async core client delivers outputs via get_output_async.")

    latest_scheduler_stats: SchedulerStats | None = None

    @property
    @abstractmethod
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks of the core."""

    @abstractmethod
    async def get_output_async(self) -> EngineCoreOutputs:
        """The next step's outputs (waits while the core is idle)."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise EngineDeadError if the core is no longer running."""

    async def reset_prefix_cache_async(self) -> bool:
        """Forget every cached KV block between two steps; False while requests hold
        blocks."""
        return bool(await asyncio.wrap_future(self.call_utility("reset_prefix_cache")))


class _CoreProcess:
    """A spawned `core_proc` child, its two sockets (bound here) and its handshake pipe."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self._dir = tempfile.mkdtemp(prefix="pagedllm-core-")
        input_addr, output_addr = f"ipc://{self._dir}/input", f"ipc://{self._dir}/output"
        self._ctx = zmq.Context()
        self.input_socket = self._ctx.socket(zmq.PUSH)
        self.input_socket.bind(input_addr)
        self.output_socket = self._ctx.socket(zmq.PULL)
        self.output_socket.bind(output_addr)
        from pagedllm.engine.core_proc import run_engine_core

        spawn = multiprocessing.get_context("spawn")  # fork + torch threads is unsafe
        self._conn, child_conn = spawn.Pipe()
        self.proc = spawn.Process(
            target=run_engine_core, name="pagedllm-engine-core", daemon=True,
            args=(engine_config, input_addr, output_addr, child_conn),
        )
        try:
            self.proc.start()
            child_conn.close()
            self.ready = self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> EngineCoreReady:
        while not self._conn.poll(_STARTUP_POLL_S):
            if not self.proc.is_alive():
                raise EngineStartupError(
                    f"The engine core process exited during startup (exit code "
                    f"{self.proc.exitcode}); see its log above.")
        try:
            ready = msgspec.msgpack.decode(self._conn.recv_bytes(), type=EngineCoreReady)
        except EOFError:
            raise EngineStartupError("The engine core process exited during startup.") from None
        if ready.error is not None:
            raise EngineStartupError(f"The engine core failed to start: {ready.error}")
        return ready

    @property
    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc.is_alive()

    def stop(self) -> None:
        """Stop the child (closing the pipe asks it to leave; then SIGTERM, SIGKILL) and remove
        the sockets' folder."""
        self._conn.close()
        if self.proc.pid is not None:
            self.proc.join(_STOP_TIMEOUT_S / 2)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(_STOP_TIMEOUT_S / 2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        self._ctx.destroy(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)


class _MPClient(EngineCoreClient):
    """Shared by the multi-process clients: sending, the receiver thread, utility calls.

    Subclasses decide where received outputs go (`_deliver`). `add_request` and
    `abort_requests` must be called from one thread (the ZMQ input socket is not thread-safe).
    """

    def __init__(self, engine_config: EngineConfig) -> None:
        self._core = _CoreProcess(engine_config)
        self._encoder = CoreRequestEncoder()
        self._error: EngineDeadError | None = None
        self._closing = False
        self._call_ids = itertools.count()
        self._calls: dict[int, Future[Any]] = {}
        # The SchedulerStats that came with the last output handed to the caller.
        self.latest_scheduler_stats: SchedulerStats | None = None
        self._receiver = threading.Thread(
            target=self._run_receiver, name="pagedllm-core-receiver", daemon=True)
        self._receiver.start()

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks of the core (from its handshake)."""
        return self._core.ready.num_gpu_blocks

    @property
    def pid(self) -> int | None:
        """The core process's id."""
        return self._core.proc.pid

    def check_health(self) -> None:
        """Raise EngineDeadError once the core process is gone."""
        if self._error is not None:
            raise self._error
        if not self._core.alive:
            raise EngineDeadError(
                f"The engine core process died (exit code {self._core.proc.exitcode}).")

    def add_request(self, request: EngineCoreRequest) -> None:
        """Send the request (never blocks)."""
        self.check_health()
        self._send(EngineCoreRequestType.ADD, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Send an abort; the core frees the blocks on its next turn."""
        if request_ids and self._error is None:
            self._send(EngineCoreRequestType.ABORT, list(request_ids))

    def call_utility(self, method: str, *args: Any) -> Future[Any]:
        """Call an EngineCore method in the child (see engine/utility.py)."""
        self.check_health()
        call_id = next(self._call_ids)
        future: Future[Any] = Future()
        self._calls[call_id] = future
        self._send(EngineCoreRequestType.UTILITY, UtilityRequest(call_id, method, list(args)))
        return future

    def shutdown(self) -> None:
        """Stop the receiver and the core process; remove the sockets."""
        self._closing = True
        self._receiver.join(_STOP_TIMEOUT_S)
        self._core.stop()
        if self._error is None:
            self._error = EngineDeadError("The engine core is not running (it was shut down).")

    def _send(self, kind: EngineCoreRequestType, payload: Any) -> None:
        self._core.input_socket.send_multipart(self._encoder.encode(kind, payload), copy=False)

    def _run_receiver(self) -> None:
        decoder, socket = CoreOutputsDecoder(), self._core.output_socket
        while not self._closing:
            if socket.poll(_POLL_MS):
                outputs = decoder.decode(socket.recv())
                if outputs.engine_error is not None:
                    self._die(EngineDeadError(f"The engine core failed: {outputs.engine_error}"))
                    return
                if outputs.utility_result is not None:
                    self._resolve(outputs)
                else:
                    self._deliver(outputs)
            elif not self._core.alive:
                code = self._core.proc.exitcode
                self._die(EngineDeadError(f"The engine core process died (exit code {code})."))
                return

    def _die(self, error: EngineDeadError) -> None:
        """Fail every waiter, now and later, with `error`."""
        logger.error("%s", error)
        self._error = error
        for future in self._calls.values():
            future.set_exception(error)
        self._deliver(error)

    def _resolve(self, outputs: EngineCoreOutputs) -> None:
        result = outputs.utility_result
        assert result is not None
        future = self._calls.pop(result.call_id, None)
        if future is not None:
            settle(future, result)

    @abstractmethod
    def _deliver(self, item: EngineCoreOutputs | EngineDeadError) -> None:
        """Hand received outputs (or the error that ended the core) to the caller."""


class SyncMPClient(_MPClient):
    """The core in a child process, for synchronous callers (`LLMEngine`, opt-in)."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self._outputs: queue.SimpleQueue[EngineCoreOutputs | EngineDeadError] = (
            queue.SimpleQueue())
        super().__init__(engine_config)

    def get_output(self) -> EngineCoreOutputs:
        """Outputs of the core's next step (waits for them)."""
        item = self._outputs.get()
        if isinstance(item, EngineDeadError):
            self._outputs.put(item)  # every later call fails too
            raise item
        if item.scheduler_stats is not None:
            self.latest_scheduler_stats = item.scheduler_stats
        return item

    def reset_prefix_cache(self) -> bool:
        """Forget the core's cached KV blocks (False while requests hold blocks)."""
        return bool(self.call_utility("reset_prefix_cache").result())

    def _deliver(self, item: EngineCoreOutputs | EngineDeadError) -> None:
        self._outputs.put(item)


class AsyncMPClient(_MPClient, AsyncEngineCoreClient):
    """The core in a child process, for an asyncio frontend (`AsyncLLM`, the server).

    `add_request`, `abort_requests` and `get_output_async` run on the event loop; the receiver
    thread hands outputs to it with `loop.call_soon_threadsafe`.
    """

    def __init__(self, engine_config: EngineConfig) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outputs: asyncio.Queue[EngineCoreOutputs | EngineDeadError] | None = None
        super().__init__(engine_config)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._outputs = loop, asyncio.Queue()

    def add_request(self, request: EngineCoreRequest) -> None:
        """Send the request (never blocks)."""
        self._bind_loop()
        super().add_request(request)

    async def get_output_async(self) -> EngineCoreOutputs:
        """The next step's outputs; raises EngineDeadError once the core died."""
        self._bind_loop()
        self.check_health()
        assert self._outputs is not None
        item = await self._outputs.get()
        if isinstance(item, EngineDeadError):
            raise item
        if item.scheduler_stats is not None:
            self.latest_scheduler_stats = item.scheduler_stats
        return item

    def _deliver(self, item: EngineCoreOutputs | EngineDeadError) -> None:
        loop, outputs = self._loop, self._outputs
        if loop is None or outputs is None:
            return  # nobody is listening yet
        with contextlib.suppress(RuntimeError):  # the event loop closed
            loop.call_soon_threadsafe(outputs.put_nowait, item)
