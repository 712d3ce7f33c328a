"""Executor: how the engine core reaches its worker(s).

One interface for one in-process worker (`UniProcExecutor`) and for a worker per rank of a
tensor/pipeline-parallel engine, as processes (`MultiprocExecutor`, "mp") or Ray actors
(`RayDistributedExecutor`, "ray"). The engine core calls `execute_model` each step, or, with
pipeline stages to fill, `execute_model_async` up to `max_concurrent_batches` times before
it waits for the oldest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedllm.core.sched_output import SchedulerOutput
    from pagedllm.lora.request import LoRARequest
    from pagedllm.worker.outputs import ModelRunnerOutput
    from pagedllm.worker.worker import KVCacheSpec


class Executor(ABC):
    """Runs scheduler outputs on the model and reports the KV cache it set up."""

    kv_cache_spec: KVCacheSpec
    # Steps that may be in flight at once (a pipeline's stages; 1 otherwise).
    max_concurrent_batches: int = 1

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Execute one step."""

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Future[Any]:
        """Start one step; its future ModelRunnerOutput (steps finish in the order sent)."""
        future: Future[Any] = Future()
        future.set_result(self.execute_model(scheduler_output))
        return future

    @abstractmethod
    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Call a Worker method on every worker; their results in rank order (a ValueError
        raised by a worker is raised here)."""

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load a LoRA adapter on every worker (ValueError when it does not fit)."""
        self.collective_rpc("add_lora", lora_request)

    def remove_lora(self, lora_int_id: int) -> None:
        """Drop a LoRA adapter from every worker."""
        self.collective_rpc("remove_lora", lora_int_id)

    def list_loras(self) -> list[int]:
        """Ids of the LoRA adapters the workers hold."""
        return list(self.collective_rpc("list_loras")[0])

    def shutdown(self) -> None:  # noqa: B027 - an optional hook: in-process holds nothing
        """Release workers (nothing to do in-process)."""
