"""Process groups for tensor parallelism, built once, and the collectives layers call.

`init_distributed_environment` joins torch.distributed (gloo on CPU, NCCL on CUDA) as one
rank of a world; `initialize_model_parallel` then splits the world into tensor-parallel
groups of `tensor_parallel_size` consecutive ranks (vLLM's layout: ranks [0, 1] form a
group of two, [2, 3] the next). A layer asks `get_tp_group()` for its group; before any
initialisation that is a group of one whose collectives return their input, so single-
process code runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


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

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return len(self.ranks)

    @property
    def is_first_rank(self) -> bool:
        """True on the group's rank 0 (the one that samples)."""
        return self.rank_in_group == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of `tensor` over the group (in place; returned for chaining)."""
        if self.world_size > 1:
            dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `tensor` concatenated along `dim`, in rank order."""
        if self.world_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, tensor: torch.Tensor, src_in_group: int = 0) -> torch.Tensor:
        """`tensor` from the group's rank `src_in_group` on every rank (in place)."""
        if self.world_size > 1:
            dist.broadcast(tensor, src=self.ranks[src_in_group], group=self.group)
        return tensor


_SINGLE = GroupCoordinator(ranks=[0], rank_in_group=0)
_tp_group: GroupCoordinator | None = None


def init_distributed_environment(
    world_size: int, rank: int, init_method: str, backend: str | None = None
) -> None:
    """Join the world as `rank` (gloo on CPU unless `backend` says otherwise)."""
    if dist.is_initialized():
        return
    dist.init_process_group(
        backend=backend or ("nccl" if torch.cuda.is_available() else "gloo"),
        init_method=init_method, world_size=world_size, rank=rank,
    )


def initialize_model_parallel(tensor_parallel_size: int) -> GroupCoordinator:
    """Build the tensor-parallel groups once; return this rank's.

    Raises:
        ValueError: when the world is not a whole number of groups.
    """
    global _tp_group
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} does not divide the world of "
            f"{world_size} ranks."
        )
    mine = None
    for first in range(0, world_size, tensor_parallel_size):
        ranks = list(range(first, first + tensor_parallel_size))
        group = dist.new_group(ranks)  # every rank creates every group, in one order
        if rank in ranks:
            mine = GroupCoordinator(ranks, ranks.index(rank), group)
    assert mine is not None
    _tp_group = mine
    return mine


def get_tp_group() -> GroupCoordinator:
    """This rank's tensor-parallel group (a group of one when none was built)."""
    return _tp_group if _tp_group is not None else _SINGLE


def destroy_model_parallel() -> None:
    """Forget the groups and leave torch.distributed (a worker shutting down)."""
    global _tp_group
    _tp_group = None
    if dist.is_initialized():
        dist.destroy_process_group()
