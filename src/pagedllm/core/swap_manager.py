"""SwapManager: host-side KV blocks of requests preempted in swap mode.

When the scheduler preempts a request by swap, the request's device blocks are copied into
blocks of a second, host-side pool and freed on the device; when it resumes, fresh device
blocks are allocated and the host blocks copied back. This class only does the host-pool
bookkeeping (a plain `BlockPool`, never prefix-cached) and returns (device block id, host
block id) pairs; the worker performs the copies. Block 0 of the host pool is unused, as in
every pool. With several KV cache groups the host blocks are kept per group; blocks a
sliding window let go (null, id 0) are neither copied out nor back.
This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedllm.core.block_pool import NULL_BLOCK_ID, BlockPool, KVCacheBlock


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
        # request_id → its host blocks per KV cache group, in token order.
        self.req_to_host_blocks: dict[str, list[list[KVCacheBlock]]] = {}

    @property
    def usage(self) -> float:
        """Share of the host pool's usable blocks holding swapped-out KV, in [0, 1]."""
        if self.block_pool is None:
            return 0.0
        return self.block_pool.get_usage()

    def get_num_free_blocks(self) -> int:
        """Host blocks free now."""
        return self.block_pool.get_num_free_blocks() if self.block_pool else 0

    def can_swap_out(self, num_blocks: int) -> bool:
        """True if `num_blocks` device blocks fit in the free host blocks."""
        return num_blocks <= self.get_num_free_blocks()

    def swap_out(
        self, request_id: str, device_block_ids: Sequence[list[int]]
    ) -> list[tuple[int, int]]:
        """Take host blocks for a request's device blocks (per group; null ids skipped).

        Returns:
            (device block id, host block id) pairs, in token order, for the worker to copy.
        """
        assert request_id not in self.req_to_host_blocks, f"{request_id} is already swapped"
        tables = [[i for i in table if i != NULL_BLOCK_ID] for table in device_block_ids]
        num_blocks = sum(len(table) for table in tables)
        assert self.block_pool is not None and self.can_swap_out(num_blocks)
        host_tables = [self.block_pool.get_new_blocks(len(table)) for table in tables]
        self.req_to_host_blocks[request_id] = host_tables
        return [
            (d, h.block_id)
            for table, host_table in zip(tables, host_tables, strict=True)
            for d, h in zip(table, host_table, strict=True)
        ]

    def get_num_host_blocks(self, request_id: str) -> int:
        """How many host blocks a swapped request holds (all groups)."""
        return sum(len(table) for table in self.req_to_host_blocks[request_id])

    def swap_in(
        self, request_id: str, device_block_ids: Sequence[list[int]]
    ) -> list[tuple[int, int]]:
        """Release a request's host blocks into its new device blocks.

        Args:
            device_block_ids: the request's new block tables, per group; the first non-null
                blocks of each receive that group's host blocks (a table may be longer, for
                the tokens of this step).

        Returns:
            (device block id, host block id) pairs for the worker to copy back.
        """
        host_tables = self.req_to_host_blocks.pop(request_id)
        assert self.block_pool is not None
        pairs: list[tuple[int, int]] = []
        for table, host_table in zip(device_block_ids, host_tables, strict=True):
            real = [i for i in table if i != NULL_BLOCK_ID]
            assert len(real) >= len(host_table), "too few device blocks to swap in"
            pairs.extend((d, h.block_id) for d, h in zip(real, host_table, strict=False))
            # The host blocks are reused only by a later step's swap-out, after the worker
            # copied them back at the start of this one.
            self.block_pool.free_blocks(reversed(host_table))
        return pairs

    def free(self, request_id: str) -> None:
        """Drop a swapped request's host blocks (abort); a no-op if it holds none."""
        for host_blocks in self.req_to_host_blocks.pop(request_id, []):
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
        held = [
            b.block_id
            for tables in self.req_to_host_blocks.values()
            for blocks in tables
            for b in blocks
        ]
        assert len(set(held)) == len(held), "a host block has two holders"
        for block_id in held:
            assert self.block_pool.blocks[block_id].ref_cnt == 1
        assert len(held) + self.get_num_free_blocks() == self.block_pool.num_usable_blocks
