"""EngineCoreProc: the engine core in its own process (started with multiprocessing "spawn").

The child builds an `EngineCore` (the model loads here), answers the parent's handshake pipe
with an `EngineCoreReady` (or the startup error), then runs three threads:

- the input thread receives ZMQ messages (type byte + msgpack payload) and queues them;
- the busy loop (main thread) applies queued adds/aborts/utility calls, calls `step()` while
  any request is unfinished, and blocks on the input queue when idle;
- the output thread encodes every step's `EngineCoreOutputs` and sends them.

The parent binds both sockets and owns their paths; the child connects. The child stops when
the handshake pipe closes (the parent shut it down, or died), or on SIGTERM. It ignores SIGINT:
a Ctrl-C reaches the whole process group and the parent decides the order of shutdown.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import zmq

from pagedllm.config import EngineConfig
from pagedllm.engine.core import EngineCore
from pagedllm.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequestType,
    UtilityRequest,
    UtilityResult,
)
from pagedllm.engine.serial import CoreOutputsEncoder, CoreRequestDecoder
from pagedllm.engine.utility import run_utility
from pagedllm.logger import init_logger
from pagedllm.request import FinishReason
from pagedllm.utils.processes import install_child_signal_handlers

logger = init_logger(__name__)


_SHUTDOWN = object()
_CRASH_REPORT_S = 1.0


class EngineCoreProc:
    """The busy loop around an EngineCore, fed and drained by the I/O threads."""

    def __init__(self, engine_core: EngineCore, input_addr: str, output_addr: str) -> None:
        self.engine_core = engine_core
        self.input_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.output_queue: queue.SimpleQueue[EngineCoreOutputs] = queue.SimpleQueue()
        self._last_stats: Any = None
        self._ctx = zmq.Context()
        for target, addr in ((self._run_input_thread, input_addr),
                             (self._run_output_thread, output_addr)):
            threading.Thread(target=target, args=(addr,), daemon=True).start()

    def run_busy_loop(self) -> None:
        """Step while there is work; return on shutdown."""
        while self._process_inputs(block=not self._has_work()):
            if self._has_work():
                self._send(self.engine_core.step())

    def _has_work(self) -> bool:
        return self.engine_core.can_step()

    def _process_inputs(self, block: bool) -> bool:
        """Apply every queued message (waiting for one if `block`); False on shutdown."""
        try:
            message = self.input_queue.get(block=block)
        except queue.Empty:
            return True
        while message is not _SHUTDOWN:
            self._apply(*message)
            try:
                message = self.input_queue.get_nowait()
            except queue.Empty:
                return True
        return False

    def _apply(self, kind: EngineCoreRequestType, payload: Any) -> None:
        if kind is EngineCoreRequestType.ADD:
            try:
                self.engine_core.add_request(payload)
            except ValueError as error:
                logger.warning("Request %s refused: %s", payload.request_id, error)
                refused = EngineCoreOutput(payload.request_id, [], finish_reason=FinishReason.ABORT)
                self._send(EngineCoreOutputs(outputs=[refused]))
        elif kind is EngineCoreRequestType.ABORT:
            self.engine_core.abort_requests(payload)
        else:
            self.output_queue.put(EngineCoreOutputs(utility_result=self._call_utility(payload)))

    def _call_utility(self, call: UtilityRequest) -> UtilityResult:
        return run_utility(self.engine_core, call)

    def _send(self, outputs: EngineCoreOutputs) -> None:
        stats = outputs.scheduler_stats
        if stats is None:
            stats = self.engine_core.make_stats()
            outputs.scheduler_stats = stats
        if not outputs.outputs and stats == self._last_stats:
            return  # an idle turn that changed nothing
        self._last_stats = stats
        self.output_queue.put(outputs)

    def report_crash(self, reason: str) -> None:
        """Send why the core dies as its last message (waiting up to a second for it to
        go: the process leaves right after)."""
        self.output_queue.put(EngineCoreOutputs(engine_error=reason))
        deadline = time.monotonic() + _CRASH_REPORT_S
        while not self.output_queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the output thread's send of the last message

    def _run_input_thread(self, addr: str) -> None:
        socket = self._ctx.socket(zmq.PULL)
        socket.connect(addr)
        decoder = CoreRequestDecoder()
        while True:
            frames = socket.recv_multipart(copy=False)
            try:
                self.input_queue.put(decoder.decode([f.buffer for f in frames]))
            except (ValueError, msgspec.DecodeError) as error:
                logger.error("Dropped a malformed message: %r", error)

    def _run_output_thread(self, addr: str) -> None:
        socket = self._ctx.socket(zmq.PUSH)
        socket.connect(addr)
        encoder = CoreOutputsEncoder()
        while True:
            socket.send(encoder.encode(self.output_queue.get()), copy=False)


def _watch_parent(conn: Connection, input_queue: queue.SimpleQueue[Any]) -> None:
    # The parent never writes after the handshake: EOF means it closed the pipe or died.
    with contextlib.suppress(EOFError, OSError):
        conn.recv_bytes()
    input_queue.put(_SHUTDOWN)


def run_engine_core(
    engine_config: EngineConfig, input_addr: str, output_addr: str, conn: Connection
) -> None:
    """Child-process entry: build the core, hand-shake, serve until told to stop."""
    install_child_signal_handlers()
    encoder = msgspec.msgpack.Encoder()
    try:
        engine_core = EngineCore(engine_config)
    except Exception as error:  # noqa: BLE001 - the parent raises it with this text
        logger.exception("The engine core failed to start.")
        conn.send_bytes(encoder.encode(EngineCoreReady(error=f"{type(error).__name__}: {error}")))
        raise SystemExit(1) from None
    proc: EngineCoreProc | None = None
    try:
        proc = EngineCoreProc(engine_core, input_addr, output_addr)
        conn.send_bytes(encoder.encode(EngineCoreReady(
            num_gpu_blocks=engine_core.executor.kv_cache_spec.num_blocks,
            max_model_len=engine_config.model_config.max_model_len,
        )))
        threading.Thread(target=_watch_parent, args=(conn, proc.input_queue), daemon=True).start()
        proc.run_busy_loop()
    except SystemExit:
        pass
    except BaseException as error:
        logger.exception("The engine core crashed.")
        if proc is not None:
            proc.report_crash(f"{type(error).__name__}: {error}")
        os._exit(1)
    finally:
        engine_core.shutdown()
    # Daemon I/O threads may sit in blocking ZMQ calls: leave without joining them.
    os._exit(0)
