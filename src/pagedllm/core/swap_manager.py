"""SwapManager: host-side KV blocks of requests preempted in swap mode.

When the scheduler preempts a request by swap, the request's device blocks are copied into
blocks of a second, host-side pool and freed on the device; when it resumes, fresh device
blocks are allocated and the host blocks copied back. This class only does the host-pool
bookkeeping (a plain `BlockPool`, never prefix-cached) and returns (device block id, host
block id) pairs; the worker performs the copies. Block 0 of the host pool is unused, as in
every pool. This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from pagedllm.core.block_pool import BlockPool, KVCacheBlock


class SwapManager:
    """Tracks which host blocks hold each swapped-out request's KV.

    Args:
        num_cpu_blocks: blocks in the host pool, including the unused block 0; fewer than 2
            means no swap space (every swap-out is refused).
    """

    def __init__(self, num_cpu_blocks: int) -> None:
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be non-negative, got {num_cpu_blocks}.")
        self.num_cpu_blocks = num_cpu_blocks
        self.block_pool = BlockPool(num_cpu_blocks) if num_cpu_blocks >= 2 else None
        # request_id → its host blocks, in token order.
        self.req_to_host_blocks: dict[str, list[KVCacheBlock]] = {}

    def get_num_free_blocks(self) -> int:
        """Host blocks free now."""
        return self.block_pool.get_num_free_blocks() if self.block_pool else 0

    def can_swap_out(self, num_blocks: int) -> bool:
        """True if `num_blocks` device blocks fit in the free host blocks."""
        return num_blocks <= self.get_num_free_blocks()

    def swap_out(self, request_id: str, device_block_ids: list[int]) -> list[tuple[int, int]]:
        """Take host blocks for a request's device blocks.

        Returns:
            (device block id, host block id) pairs, in token order, for the worker to copy.
        """
        assert request_id not in self.req_to_host_blocks, f"{request_id} is already swapped"
        assert self.block_pool is not None and self.can_swap_out(len(device_block_ids))
        host_blocks = self.block_pool.get_new_blocks(len(device_block_ids))
        self.req_to_host_blocks[request_id] = host_blocks
        return [(d, h.block_id) for d, h in zip(device_block_ids, host_blocks, strict=True)]

    def get_num_host_blocks(self, request_id: str) -> int:
        """How many host blocks a swapped request holds."""
        return len(self.req_to_host_blocks[request_id])

    def swap_in(self, request_id: str, device_block_ids: list[int]) -> list[tuple[int, int]]:
        """Release a request's host blocks into its new device blocks.

        Args:
            device_block_ids: the request's new block table; its first blocks receive the
                host blocks (the table may be longer, for the tokens of this step).

        Returns:
            (device block id, host block id) pairs for the worker to copy back.
        """
        host_blocks = self.req_to_host_blocks.pop(request_id)
        assert len(device_block_ids) >= len(host_blocks), "too few device blocks to swap in"
        assert self.block_pool is not None
        # The host blocks are reused only by a later step's swap-out, after the worker copied
        # them back at the start of this one.
        self.block_pool.free_blocks(reversed(host_blocks))
        return [(d, h.block_id) for d, h in zip(device_block_ids, host_blocks, strict=False)]

    def free(self, request_id: str) -> None:
        """Drop a swapped request's host blocks (abort); a no-op if it holds none."""
        host_blocks = self.req_to_host_blocks.pop(request_id, [])
        if host_blocks:
            assert self.block_pool is not None
            self.block_pool.free_blocks(reversed(host_blocks))

    def get_request_ids(self) -> set[str]:
        """Ids of the requests holding host blocks."""
        return set(self.req_to_host_blocks)

    def check_integrity(self) -> None:
        """Assert: every used host block has exactly one holder, free + used == total."""
        if self.block_pool is None:
            assert not self.req_to_host_blocks
            return
        self.block_pool.check_integrity()
        held = [b.block_id for blocks in self.req_to_host_blocks.values() for b in blocks]
        assert len(set(held)) == len(held), "a host block has two holders"
        for block_id in held:
            assert self.block_pool.blocks[block_id].ref_cnt == 1
        assert len(held) + self.get_num_free_blocks() == self.block_pool.num_usable_blocks
