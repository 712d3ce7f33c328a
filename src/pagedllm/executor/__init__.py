"""Executors: how the engine core reaches its workers (abstract.py), one in-process
(uniproc.py) or one per rank of a tensor/pipeline-parallel engine, as processes
(multiproc.py) or Ray actors (ray_executor.py), sharing distributed.py, the broadcast
channels (channels.py) and the rank's loop (worker_proc.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedllm.config import EngineConfig
    from pagedllm.executor.abstract import Executor


def make_executor(engine_config: EngineConfig) -> Executor:
    """The executor `parallel_config.distributed_executor_backend` names ("uni" for one
    rank when none is named, "mp" for more)."""
    parallel = engine_config.parallel_config
    backend = parallel.distributed_executor_backend
    if backend is None:
        backend = "uni" if parallel.world_size == 1 else "mp"
    if backend == "uni":
        from pagedllm.executor.uniproc import UniProcExecutor

        return UniProcExecutor(engine_config)
    if backend == "mp":
        from pagedllm.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(engine_config)
    from pagedllm.executor.ray_executor import RayDistributedExecutor

    return RayDistributedExecutor(engine_config)
