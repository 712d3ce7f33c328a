"""MultiprocExecutor ("mp"): a spawned worker process per rank on this node.

Workers reach the executor over `ipc://` sockets in a private folder and each other over
torch.distributed (a TCP rendezvous on loopback). Each process is tied to the executor by
a pipe: it leaves when the pipe closes (the executor shut down, or its process died), so no
worker outlives the engine. CPU threads are shared out: each rank gets cores / ranks
(unless PAGEDLLM_NUM_THREADS says otherwise).
"""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from pagedllm.executor.distributed import DistributedExecutor, WorkerFailedError
from pagedllm.utils.processes import child_thread_env, free_port, threads_per_process

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from pagedllm.worker.worker import KVCacheSpec

_STARTUP_POLL_S = 0.5
_STOP_TIMEOUT_S = 5.0


class MultiprocExecutor(DistributedExecutor):
    """A worker process per rank on this node."""

    def _channel_addresses(self) -> tuple[str, str]:
        self._dir = tempfile.mkdtemp(prefix="pagedllm-workers-")
        return f"ipc://{self._dir}/broadcast", f"ipc://{self._dir}/responses"

    def _start_workers(self) -> list[KVCacheSpec]:
        from pagedllm.executor.worker_proc import run_worker_process

        spawn = multiprocessing.get_context("spawn")  # fork + torch threads is unsafe
        # The engine core's own process may be daemonic (its parent owns its lifetime), and
        # multiprocessing refuses children to daemons; ours are tied to this process by
        # their pipes and stopped in shutdown().
        current = multiprocessing.current_process()
        if current.daemon:
            current.daemon = False
        init_method = f"tcp://127.0.0.1:{free_port()}"
        threads = threads_per_process(self.world_size)
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        with child_thread_env(threads):
            for rank in range(self.world_size):
                parent_conn, child_conn = spawn.Pipe()
                proc = spawn.Process(
                    target=run_worker_process, name=f"pagedllm-worker-{rank}", daemon=True,
                    args=(self.config, rank, init_method, self.channels.broadcast_addr,
                          self.channels.response_addr, child_conn),
                )
                proc.start()
                child_conn.close()
                self._procs.append(proc)
                self._conns.append(parent_conn)
        return [self._wait_ready(rank) for rank in range(self.world_size)]

    def _wait_ready(self, rank: int) -> KVCacheSpec:
        conn, proc = self._conns[rank], self._procs[rank]
        while not conn.poll(_STARTUP_POLL_S):
            dead = self._dead_workers()
            if dead:
                rank_dead = min(dead)
                raise WorkerFailedError(
                    f"Worker rank {rank_dead} {dead[rank_dead]} while the engine started; "
                    "see its log above.")
        try:
            kind, payload = conn.recv()
        except EOFError:
            raise WorkerFailedError(
                f"Worker rank {rank} exited while the engine started (exit code "
                f"{proc.exitcode}).") from None
        if kind == "error":
            raise WorkerFailedError(f"Worker rank {rank} failed to start: {payload}")
        return payload  # type: ignore[no-any-return]

    def _dead_workers(self) -> dict[int, str]:
        return {
            rank: f"(pid {proc.pid}) died with exit code {proc.exitcode}"
            for rank, proc in enumerate(getattr(self, "_procs", []))
            if not proc.is_alive()
        }

    @property
    def worker_pids(self) -> list[int | None]:
        """Each rank's process id."""
        return [proc.pid for proc in self._procs]

    def _stop_workers(self) -> None:
        for conn in getattr(self, "_conns", []):
            conn.close()  # a worker still loading leaves when it sees this
        procs: list[Any] = getattr(self, "_procs", [])
        for proc in procs:
            proc.join(_STOP_TIMEOUT_S)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(_STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)
