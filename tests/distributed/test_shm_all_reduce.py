"""The shared-memory all-reduce of CPU ranks on one node: over two and three gloo processes,
many calls in a row (the two slots alternate) of several shapes and dtypes give every rank
the same sum, equal to gloo's, and all-gathers equal gloo's; a tensor larger than a slot
goes through gloo; the file is gone once mapped; PAGEDLLM_SHM_ALL_REDUCE=0 turns it off."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from pagedllm.distributed import parallel_state, shm_all_reduce

pytestmark = pytest.mark.skipif(not shm_all_reduce.supported(), reason="x86-64 only")


def _rank_main(rank: int, world_size: int, init_file: str, enabled: bool) -> None:
    import torch.distributed as dist

    os.environ["PAGEDLLM_SHM_ALL_REDUCE"] = "1" if enabled else "0"
    parallel_state.init_distributed_environment(world_size, rank, f"file://{init_file}",
                                                "gloo")
    group = parallel_state.initialize_model_parallel(world_size)
    try:
        assert (group.shm is not None) == enabled
        if not enabled:
            return
        if rank == 0:  # it unlinked the file once every rank had mapped it
            assert not [n for n in os.listdir("/dev/shm") if n.startswith("pagedllm-allreduce")]
        generator = torch.Generator().manual_seed(rank)
        for step in range(40):
            dtype = (torch.float32, torch.bfloat16)[step % 2]
            shape = (1 + step % 5, 64 + step)
            mine = torch.randn(shape, generator=generator).to(dtype)
            expected = mine.clone()
            dist.all_reduce(expected)  # gloo
            got = group.all_reduce(mine.clone())
            parts = [torch.empty_like(got) for _ in range(world_size)]
            dist.all_gather(parts, got)
            assert all(torch.equal(part, got) for part in parts)  # the same bits everywhere
            torch.testing.assert_close(got, expected, rtol=2e-2 if dtype != torch.float32
                                       else 1e-6, atol=1e-2)
            gathered = group.all_gather(mine, dim=step % 2)  # through the same slots
            theirs = [torch.empty_like(mine) for _ in range(world_size)]
            dist.all_gather(theirs, mine)
            assert torch.equal(gathered, torch.cat(theirs, dim=step % 2))
        big = torch.ones(shm_all_reduce.SLOT_BYTES // 4 + 1)  # a slot too small: gloo
        assert not group.shm.fits(big)
        assert torch.equal(group.all_reduce(big), torch.full_like(big, world_size))
    finally:
        parallel_state.destroy_model_parallel()


@pytest.mark.parametrize("world_size", [2, 3])
def test_shared_memory_sum_equals_gloo(world_size, tmp_path: Path):
    mp.spawn(_rank_main, args=(world_size, str(tmp_path / "init"), True), nprocs=world_size,
             join=True)


def test_switched_off(tmp_path: Path):
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init"), False), nprocs=2, join=True)
