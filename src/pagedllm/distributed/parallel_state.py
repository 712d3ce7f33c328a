"""Process groups for tensor and pipeline parallelism, built once, and their collectives.

`init_distributed_environment` joins torch.distributed (gloo on CPU, NCCL on CUDA) as one
rank of a world; `initialize_model_parallel` then splits the world as vLLM does: rank
`pp_rank * tp + tp_rank`, so tensor-parallel groups are `tp` consecutive ranks ([0, 1],
[2, 3] for -tp 2 -pp 2) and pipeline groups take one rank of each stage ([0, 2], [1, 3]).
A layer asks `get_tp_group()` for its group, the runner `get_pp_group()` for its stage;
before any initialisation both are groups of one whose collectives return their input, so
single-process code runs unchanged.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pagedllm import envs
from pagedllm.distributed import shm_all_reduce
from pagedllm.platform import current_platform


@dataclass
class GroupCoordinator:
    """One process group as a rank sees it.

    Attributes:
        ranks: the global ranks in the group, in order.
        rank_in_group: this process's index in `ranks`.
        group: the torch.distributed group (None for a group of one).
    """

    ranks: list[int]
    rank_in_group: int
    group: dist.ProcessGroup | None = None
    # Sums through shared memory when every rank is a CPU process on this node.
    shm: shm_all_reduce.ShmAllReduce | None = None

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return len(self.ranks)

    @property
    def is_first_rank(self) -> bool:
        """True on the group's rank 0 (the one that samples)."""
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        """True on the group's last rank (a pipeline's last stage)."""
        return self.rank_in_group == self.world_size - 1

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """The sum (or "min") of `tensor` over the group (in place; returned for chaining)."""
        if self.world_size == 1:
            return tensor
        if (self.shm is not None and op == "sum" and tensor.is_contiguous()
                and self.shm.fits(tensor)):
            return self.shm.all_reduce(tensor)
        reduce_op = dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.SUM
        dist.all_reduce(tensor, op=reduce_op, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `tensor` concatenated along `dim`, in rank order."""
        if self.world_size == 1:
            return tensor
        if self.shm is not None and tensor.is_contiguous() and self.shm.fits(tensor):
            return self.shm.all_gather(tensor, dim)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, tensor: torch.Tensor, src_in_group: int = 0) -> torch.Tensor:
        """`tensor` from the group's rank `src_in_group` on every rank (in place)."""
        if self.world_size > 1:
            dist.broadcast(tensor, src=self.ranks[src_in_group], group=self.group)
        return tensor


    def send_next(self, tensors: list[torch.Tensor]) -> None:
        """Send `tensors` to the next rank of the group (a pipeline's next stage)."""
        destination = self.ranks[self.rank_in_group + 1]
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=destination, group=self.group)

    def recv_previous(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Fill `tensors` (shapes known to both sides) from the previous rank's send."""
        source = self.ranks[self.rank_in_group - 1]
        for tensor in tensors:
            dist.recv(tensor, src=source, group=self.group)
        return tensors


_SINGLE = GroupCoordinator(ranks=[0], rank_in_group=0)
_tp_group: GroupCoordinator | None = None
_pp_group: GroupCoordinator | None = None
_world_group: GroupCoordinator | None = None
_expert_parallel = False


def init_distributed_environment(
    world_size: int, rank: int, init_method: str, backend: str | None = None
) -> None:
    """Join the world as `rank` (gloo on CPU unless `backend` says otherwise)."""
    if dist.is_initialized():
        return
    dist.init_process_group(
        backend=backend or current_platform().dist_backend,
        init_method=init_method, world_size=world_size, rank=rank,
    )


def _build_groups(all_ranks: list[list[int]], rank: int) -> GroupCoordinator:
    """Create every group (each rank creates all of them, in one order); return `rank`'s."""
    mine = None
    for ranks in all_ranks:
        group = dist.new_group(ranks) if len(ranks) > 1 else None
        if rank in ranks:
            mine = GroupCoordinator(ranks, ranks.index(rank), group)
    assert mine is not None
    return mine


def initialize_model_parallel(
    tensor_parallel_size: int, pipeline_parallel_size: int = 1,
    enable_expert_parallel: bool = False,
) -> GroupCoordinator:
    """Build the tensor- and pipeline-parallel groups once; return this rank's TP group.
    With `enable_expert_parallel` MoE layers give each rank of the TP group whole experts
    instead of a slice of every expert.

    Raises:
        ValueError: when the world is not tensor x pipeline ranks.
    """
    global _tp_group, _pp_group, _world_group, _expert_parallel
    _expert_parallel = enable_expert_parallel
    world_size, rank = dist.get_world_size(), dist.get_rank()
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    if world_size != tp * pp:
        raise ValueError(
            f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} does not make the "
            f"world of {world_size} ranks."
        )
    _world_group = GroupCoordinator(list(range(world_size)), rank, dist.group.WORLD)
    _tp_group = _build_groups([list(range(s * tp, (s + 1) * tp)) for s in range(pp)], rank)
    _pp_group = _build_groups([list(range(t, world_size, tp)) for t in range(tp)], rank)
    _tp_group.shm = _shared_memory_all_reduce(_tp_group)
    return _tp_group


def _shared_memory_all_reduce(group: GroupCoordinator) -> shm_all_reduce.ShmAllReduce | None:
    """The shared-memory all-reduce for `group`, when its ranks are CPU (gloo) processes of
    one x86 node and PAGEDLLM_SHM_ALL_REDUCE is not 0 (the same answer on every rank)."""
    if group.world_size == 1 or dist.get_backend(group.group) != "gloo":
        return None
    hosts: list[str | None] = [None] * group.world_size
    dist.all_gather_object(hosts, socket.gethostname(), group=group.group)
    if len(set(hosts)) > 1 or not shm_all_reduce.supported() or not envs.shm_all_reduce():
        return None
    return shm_all_reduce.ShmAllReduce(group.group, group.ranks, group.rank_in_group)


def get_tp_group() -> GroupCoordinator:
    """This rank's tensor-parallel group (a group of one when none was built)."""
    return _tp_group if _tp_group is not None else _SINGLE


def get_pp_group() -> GroupCoordinator:
    """This rank's pipeline group: one rank per stage, in stage order (a group of one when
    none was built)."""
    return _pp_group if _pp_group is not None else _SINGLE


def get_world_group() -> GroupCoordinator:
    """Every rank of the engine (a group of one when none was built)."""
    return _world_group if _world_group is not None else _SINGLE


def expert_parallel_enabled() -> bool:
    """True when MoE experts are spread whole over the TP group (enable_expert_parallel)."""
    return _expert_parallel


def single_rank_group() -> GroupCoordinator:
    """A group of one: layers built with it are not split (an expert-parallel rank's
    experts)."""
    return _SINGLE


def destroy_model_parallel() -> None:
    """Forget the groups and leave torch.distributed (a worker shutting down)."""
    global _tp_group, _pp_group, _world_group, _expert_parallel
    if _tp_group is not None and _tp_group.shm is not None:
        _tp_group.shm.close()
    _tp_group = _pp_group = _world_group = None
    _expert_parallel = False
    if dist.is_initialized():
        dist.destroy_process_group()
