"""Executor: how the engine core reaches its worker(s). One in-process worker for now;
multi-process and tensor-parallel executors implement the same interface later."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pagedllm.config import EngineConfig
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.lora.request import LoRARequest
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.worker import KVCacheSpec, Worker


class Executor(ABC):
    """Runs scheduler outputs on the model and reports the KV cache it set up."""

    kv_cache_spec: KVCacheSpec

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Execute one step."""

    @abstractmethod
    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load a LoRA adapter on every worker (ValueError when it does not fit)."""

    @abstractmethod
    def remove_lora(self, lora_int_id: int) -> None:
        """Drop a LoRA adapter from every worker."""

    @abstractmethod
    def list_loras(self) -> list[int]:
        """Ids of the LoRA adapters the workers hold."""

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

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load the adapter on the worker."""
        self.worker.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> None:
        """Drop the adapter from the worker."""
        self.worker.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        """The worker's loaded adapters."""
        return self.worker.list_loras()
