"""DPAsyncMPClient: data parallelism, `data_parallel_size` engine cores behind one frontend.

Each core is an ordinary engine-core process (`AsyncMPClient`), with its own scheduler, KV
cache and executor (its own tensor/pipeline-parallel workers, which under the "ray" backend
may be placed on other nodes). A new request goes to the least loaded core: the fewest
waiting requests (by its last reported stats, weighted x4 as vLLM does) plus requests sent
to it and not finished, then the lowest KV cache usage. Aborts go to the request's core,
utility calls (LoRA, prefix cache) to every core, and the outputs of all cores are merged
into one stream; the metrics see the cores' stats summed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import Future
from typing import Any

from pagedllm.config import EngineConfig
from pagedllm.engine.core_client import AsyncEngineCoreClient, AsyncMPClient
from pagedllm.engine.protocol import EngineCoreOutputs, EngineCoreRequest
from pagedllm.metrics.stats import SchedulerStats, merge_scheduler_stats
from pagedllm.utils.processes import child_thread_env, threads_per_process

# vLLM's balance: a waiting request weighs four running ones.
_WAITING_WEIGHT = 4


class DPAsyncMPClient(AsyncEngineCoreClient):
    """`data_parallel_size` engine-core processes, load-balanced (see the module docstring)."""

    def __init__(self, engine_config: EngineConfig) -> None:
        parallel = engine_config.parallel_config
        size = parallel.data_parallel_size
        # Every core and its workers share this machine's cores.
        threads = threads_per_process(size * parallel.world_size)
        self.cores: list[AsyncMPClient] = []
        try:
            with child_thread_env(threads):
                for rank in range(size):
                    self.cores.append(AsyncMPClient(_for_rank(engine_config, rank)))
        except BaseException:
            self.shutdown()
            raise
        self._owner: dict[str, int] = {}  # unfinished request id -> its core
        self._num_assigned = [0] * size
        # Requests each core was sent over the engine's life.
        self.num_requests_sent = [0] * size
        self._stats: list[SchedulerStats | None] = [None] * size
        self._pending: dict[int, asyncio.Future[EngineCoreOutputs]] = {}

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks of one core (each has its own cache of this size)."""
        return self.cores[0].num_gpu_blocks

    def check_health(self) -> None:
        """Raise EngineDeadError when any core is gone."""
        for core in self.cores:
            core.check_health()

    def add_request(self, request: EngineCoreRequest) -> None:
        """Send the request to the least loaded core."""
        index = min(range(len(self.cores)), key=self._load)
        self._owner[request.request_id] = index
        self._num_assigned[index] += 1
        self.num_requests_sent[index] += 1
        self.cores[index].add_request(request)

    def _load(self, index: int) -> tuple[int, float]:
        stats = self._stats[index]
        waiting = stats.num_waiting_reqs if stats is not None else 0
        usage = stats.kv_cache_usage if stats is not None else 0.0
        return _WAITING_WEIGHT * waiting + self._num_assigned[index], usage

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort each request in its core."""
        by_core: dict[int, list[str]] = {}
        for request_id in request_ids:
            index = self._owner.get(request_id)
            if index is not None:
                by_core.setdefault(index, []).append(request_id)
        for index, ids in by_core.items():
            self.cores[index].abort_requests(ids)
            for request_id in ids:
                del self._owner[request_id]
            self._num_assigned[index] -= len(ids)

    async def get_output_async(self) -> EngineCoreOutputs:
        """The next outputs of whichever core has some (raises EngineDeadError when a core
        died)."""
        for index, core in enumerate(self.cores):
            if index not in self._pending:
                self._pending[index] = asyncio.ensure_future(core.get_output_async())
        done, _ = await asyncio.wait(
            self._pending.values(), return_when=asyncio.FIRST_COMPLETED
        )
        index = next(i for i, task in self._pending.items() if task in done)
        outputs = self._pending.pop(index).result()
        self._account(index, outputs)
        return outputs

    def _account(self, index: int, outputs: EngineCoreOutputs) -> None:
        """Note finished requests and the core's stats; report the merged stats."""
        for output in outputs.outputs:
            finished = output.finish_reason is not None or output.pooling_output is not None
            if finished and self._owner.pop(output.request_id, None) is not None:
                self._num_assigned[index] -= 1
        if outputs.scheduler_stats is not None:
            self._stats[index] = outputs.scheduler_stats
            outputs.scheduler_stats = merge_scheduler_stats(
                [s for s in self._stats if s is not None]
            )
            self.latest_scheduler_stats = outputs.scheduler_stats

    def call_utility(self, method: str, *args: Any) -> Future[Any]:
        """Call the method on every core; the first core's result once all answered."""
        futures = [core.call_utility(method, *args) for core in self.cores]
        combined: Future[Any] = Future()
        remaining = [len(futures)]

        def settle(_: Future[Any]) -> None:
            remaining[0] -= 1
            if remaining[0]:
                return
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                combined.set_exception(errors[0])  # type: ignore[arg-type]
            else:
                combined.set_result(futures[0].result())

        for future in futures:
            future.add_done_callback(settle)
        return combined

    async def reset_prefix_cache_async(self) -> bool:
        """Forget every core's cached KV blocks (False if any core had blocks in use)."""
        results = await asyncio.gather(*(c.reset_prefix_cache_async() for c in self.cores))
        return all(results)

    def shutdown(self) -> None:
        """Stop every core."""
        for task in self._pending.values() if hasattr(self, "_pending") else []:
            task.cancel()
        for core in self.cores:
            core.shutdown()


def _for_rank(engine_config: EngineConfig, rank: int) -> EngineConfig:
    """Core `rank`'s config: its own KV-events ports (each core publishes its cache)."""
    events = engine_config.kv_events_config
    if events is None:
        return engine_config
    return dataclasses.replace(engine_config, kv_events_config=events.for_rank(rank))
