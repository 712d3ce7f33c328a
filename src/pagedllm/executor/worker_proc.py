"""WorkerProc: one rank of a tensor/pipeline-parallel engine, the same code under "mp"
(a spawned process, `run_worker_process`) and "ray" (an actor, ray_executor.py).

It joins torch.distributed, builds the process groups, loads its shard of the model and its
own KV cache (`Worker`), then serves what the executor publishes: each step's
SchedulerOutput (every rank runs it; only the driver answers), method calls (every rank
answers), shutdown. A failure is answered before the worker exits, so the executor can say
which rank failed and why.
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from pagedllm.config import EngineConfig
from pagedllm.distributed import parallel_state
from pagedllm.executor.channels import (
    ERROR,
    EXECUTE,
    FATAL,
    OUTPUT,
    RESULT,
    SHUTDOWN,
    WorkerChannels,
)
from pagedllm.logger import init_logger
from pagedllm.utils.processes import install_child_signal_handlers
from pagedllm.worker.worker import Worker

logger = init_logger(__name__)


class WorkerProc:
    """One rank: its Worker and the loop that serves the executor's messages."""

    def __init__(
        self, engine_config: EngineConfig, rank: int, init_method: str, broadcast_addr: str,
        response_addr: str,
    ) -> None:
        parallel = engine_config.parallel_config
        self.rank = rank
        on_cuda = str(engine_config.device_config.device).startswith("cuda")
        if on_cuda:  # one GPU per rank of this node
            torch.cuda.set_device(rank % torch.cuda.device_count())
        parallel_state.init_distributed_environment(
            parallel.world_size, rank, init_method, "nccl" if on_cuda else "gloo"
        )
        parallel_state.initialize_model_parallel(
            parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
            parallel.enable_expert_parallel,
        )
        self.worker = Worker(engine_config)
        # The first tensor-parallel rank of the last stage samples and answers each step.
        self.is_driver = self.worker.model_runner.is_driver
        self.channels = WorkerChannels(rank, broadcast_addr, response_addr)

    def run(self) -> None:
        """Serve published messages until shutdown. A failure is answered (FATAL, with its
        traceback), then raised."""
        try:
            while True:
                message = self.channels.receive()
                if message[0] == SHUTDOWN:
                    return
                try:
                    self._handle(message)
                except BaseException:
                    self.channels.respond(FATAL, traceback.format_exc())
                    raise
        finally:
            self.channels.close()
            parallel_state.destroy_model_parallel()

    def _handle(self, message: tuple[Any, ...]) -> None:
        if message[0] == EXECUTE:
            output = self.worker.execute_model(message[1])
            if self.is_driver:
                self.channels.respond(OUTPUT, output)
            return
        _, method, args = message
        try:
            result = getattr(self.worker, method)(*args)
        except ValueError as error:  # bad input (an adapter that does not fit): not fatal
            self.channels.respond(ERROR, str(error))
            return
        self.channels.respond(RESULT, result)


def _exit_when_parent_goes(conn: Connection) -> None:
    # The executor never writes after the handshake: EOF means it closed the pipe or died.
    with contextlib.suppress(EOFError, OSError):
        conn.recv_bytes()
    os._exit(1)


def run_worker_process(
    engine_config: EngineConfig, rank: int, init_method: str, broadcast_addr: str,
    response_addr: str, conn: Connection,
) -> None:
    """Process entry ("mp"): build the rank, report ready (its KV cache spec) or the error,
    serve until shutdown. The process leaves when its executor's pipe closes."""
    install_child_signal_handlers()
    try:
        proc = WorkerProc(engine_config, rank, init_method, broadcast_addr, response_addr)
    except Exception as error:  # noqa: BLE001 - the executor raises it, naming the rank
        logger.exception("Worker rank %d failed to start.", rank)
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(error).__name__}: {error}"))
        os._exit(1)
    conn.send(("ready", proc.worker.kv_cache_spec))
    threading.Thread(target=_exit_when_parent_goes, args=(conn,), daemon=True).start()
    try:
        proc.run()
    except SystemExit:
        pass
    except BaseException:
        logger.exception("Worker rank %d failed.", rank)
        os._exit(1)
    os._exit(0)
