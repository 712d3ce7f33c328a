"""Executor: how the engine core reaches its worker(s). One in-process worker for now;
multi-process and tensor-parallel executors implement the same interface later."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pagedllm.config import EngineConfig
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.worker import KVCacheSpec, Worker


class Executor(ABC):
    """Runs scheduler outputs on the model and reports the KV cache it set up."""

    kv_cache_spec: KVCacheSpec

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Execute one step."""

    def shutdown(self) -> None:  # noqa: B027 - an optional hook: in-process holds nothing
        """Release workers (nothing to do in-process)."""


class UniProcExecutor(Executor):
    """One worker in this process."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.worker = Worker(engine_config)
        self.kv_cache_spec = self.worker.kv_cache_spec

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Execute one step on the worker."""
        return self.worker.execute_model(scheduler_output)
