"""UniProcExecutor: one worker in the engine core's own process (one rank: the default)."""

from __future__ import annotations

from typing import Any

from pagedllm.config import EngineConfig
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.executor.abstract import Executor
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.worker import Worker


class UniProcExecutor(Executor):
    """One worker in this process."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.worker = Worker(engine_config)
        self.kv_cache_spec = self.worker.kv_cache_spec

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Execute one step on the worker."""
        return self.worker.execute_model(scheduler_output)

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Call the worker's method."""
        return [getattr(self.worker, method)(*args)]

    def shutdown(self) -> None:
        """Release what the worker started (a KV connector's threads and sockets)."""
        self.worker.shutdown()
