"""RayDistributedExecutor ("ray"): a Ray actor per rank, in a placement group, on an
existing Ray cluster (`ray start --head` on one node, `ray start --address=HEAD:6379` on the
others; RAY_ADDRESS or "auto" finds it).

The actors run the very worker code of "mp" (`WorkerProc`): they reach the executor over
`tcp://` sockets on this node's address and each other over torch.distributed. A rank's
`run()` call lasts the actor's life, so it ending (the actor died or its loop failed) is
how a lost worker shows.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pagedllm.executor.distributed import DistributedExecutor, WorkerFailedError
from pagedllm.logger import init_logger
from pagedllm.utils.processes import free_port

if TYPE_CHECKING:
    from pagedllm.config import EngineConfig
    from pagedllm.worker.worker import KVCacheSpec

logger = init_logger(__name__)

_PLACEMENT_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 5.0


class RayWorkerActor:
    """The actor around one rank's WorkerProc (made a Ray actor class when Ray loads)."""

    def setup(
        self, engine_config: EngineConfig, rank: int, init_method: str, broadcast_addr: str,
        response_addr: str,
    ) -> KVCacheSpec:
        """Build the rank (joins the others: every actor's setup runs at once)."""
        from pagedllm.executor.worker_proc import WorkerProc

        self.proc = WorkerProc(engine_config, rank, init_method, broadcast_addr, response_addr)
        return self.proc.worker.kv_cache_spec

    def run(self) -> None:
        """Serve the executor until shutdown (returns then; raises on failure)."""
        self.proc.run()

    def pid(self) -> int:
        """The actor's process id."""
        return os.getpid()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(
            'distributed_executor_backend="ray" needs Ray: pip install "ray[default]" '
            "(and a cluster: `ray start --head`)."
        ) from None
    return ray


class RayDistributedExecutor(DistributedExecutor):
    """A Ray actor per rank, placed by a placement group (see the module docstring)."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self._ray = _import_ray()
        self._connect()
        self._ip = self._ray.util.get_node_ip_address()
        super().__init__(engine_config)

    def _connect(self) -> None:
        ray = self._ray
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            address = os.environ.get("RAY_ADDRESS", "auto")
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError as error:
                raise ValueError(
                    f'distributed_executor_backend="ray" found no Ray cluster at {address!r} '
                    f"({error}); start one with `ray start --head`."
                ) from None

    def _channel_addresses(self) -> tuple[str, str]:
        return f"tcp://{self._ip}:0", f"tcp://{self._ip}:0"

    def _start_workers(self) -> list[KVCacheSpec]:
        ray = self._ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        on_cuda = str(self.config.device_config.device).startswith("cuda")
        bundle = {"GPU": 1, "CPU": 1} if on_cuda else {"CPU": 1}
        self._group = placement_group([dict(bundle)] * self.world_size, strategy="PACK")
        ready, _ = ray.wait([self._group.ready()], timeout=_PLACEMENT_TIMEOUT_S)
        if not ready:
            raise WorkerFailedError(
                f"The Ray cluster cannot place {self.world_size} workers of {bundle} "
                f"(resources: {ray.cluster_resources()})."
            )
        actor_class = ray.remote(RayWorkerActor)
        self._actors = [
            actor_class.options(
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._group, placement_group_bundle_index=rank
                ),
            ).remote()
            for rank in range(self.world_size)
        ]
        init_method = f"tcp://{self._ip}:{free_port(self._ip)}"
        setups = [
            actor.setup.remote(self.config, rank, init_method, self.channels.broadcast_addr,
                               self.channels.response_addr)
            for rank, actor in enumerate(self._actors)
        ]
        try:
            specs: list[KVCacheSpec] = ray.get(setups)
        except Exception as error:
            raise WorkerFailedError(f"A Ray worker failed to start: {error}") from None
        self.worker_pids: list[int] = ray.get([actor.pid.remote() for actor in self._actors])
        self._runs = [actor.run.remote() for actor in self._actors]
        return specs

    def _dead_workers(self) -> dict[int, str]:
        runs = getattr(self, "_runs", [])
        if not runs:
            return {}
        ended, _ = self._ray.wait(runs, num_returns=len(runs), timeout=0)
        dead = {}
        for rank, run in enumerate(runs):
            if run in ended:
                try:
                    self._ray.get(run)
                    dead[rank] = "(Ray actor) left its loop"
                except Exception as error:  # noqa: BLE001 - its text names the cause
                    dead[rank] = f"(Ray actor) died: {type(error).__name__}"
        return dead

    def _stop_workers(self) -> None:
        ray = self._ray
        runs = getattr(self, "_runs", [])
        if runs:
            ray.wait(runs, num_returns=len(runs), timeout=_STOP_TIMEOUT_S)
        for actor in getattr(self, "_actors", []):
            ray.kill(actor)
        group = getattr(self, "_group", None)
        if group is not None:
            ray.util.remove_placement_group(group)
        if self._owns_connection:
            ray.shutdown()
