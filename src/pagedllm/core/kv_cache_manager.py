"""KVCacheManager: the policy layer over BlockPool, tracking each request's block table.

It answers "can this request grow by N tokens?" by allocating blocks (or returning None),
and frees a request's blocks when it ends or is preempted. It does not decide who runs:
that is the scheduler's job, and the scheduler reaches blocks only through this class.
Prefix caching plugs in here later (`get_computed_blocks`, caching full blocks by hash);
block tables already hold `KVCacheBlock` objects so a block can carry its hash.
This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from collections import Counter

from pagedllm.core.block_pool import BlockPool, KVCacheBlock
from pagedllm.request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (core/ may not import pagedllm.utils)."""
    return -(a // -b)


class KVCacheManager:
    """Allocates and frees KV blocks per request.

    Args:
        num_blocks: blocks in the pool, including the reserved null block 0.
        block_size: tokens per block.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}.")
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        # request_id → its block table, in token order.
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be handed to requests (all but the null block)."""
        return self.block_pool.num_usable_blocks

    @property
    def usage(self) -> float:
        """Share of usable blocks in use, in [0, 1]."""
        return self.block_pool.get_usage()

    def get_num_free_blocks(self) -> int:
        """Blocks free now."""
        return self.block_pool.get_num_free_blocks()

    def get_num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return cdiv(num_tokens, self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Grow `request`'s block table so it holds KV for `num_new_tokens` more tokens.

        The table must cover `num_computed_tokens + num_new_tokens` tokens afterwards.

        Returns:
            The ids of the blocks appended (possibly empty), or None if too few blocks are
            free; on None nothing is changed.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be non-negative, got {num_new_tokens}.")
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_needed = self.get_num_blocks_needed(request.num_computed_tokens + num_new_tokens)
        num_to_allocate = max(0, num_needed - len(blocks))
        if num_to_allocate > self.get_num_free_blocks():
            return None
        new_blocks = self.block_pool.get_new_blocks(num_to_allocate)
        self.req_to_blocks.setdefault(request.request_id, []).extend(new_blocks)
        return [block.block_id for block in new_blocks]

    def get_block_ids(self, request_id: str) -> list[int]:
        """A copy of the request's block table (empty if it holds no blocks)."""
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def get_request_ids(self) -> set[str]:
        """Ids of the requests that hold a block table."""
        return set(self.req_to_blocks)

    def free(self, request: Request) -> None:
        """Return all of `request`'s blocks to the pool (a no-op if it holds none).

        Blocks are freed tail first, so a request's last blocks are reused before its first
        ones: with prefix caching the shared prefix survives longest.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))

    def check_integrity(self) -> None:
        """Assert: free + used == total, ref counts == holders, no block both free and held."""
        self.block_pool.check_integrity()
        holders: Counter[int] = Counter()
        for request_id, blocks in self.req_to_blocks.items():
            ids = [block.block_id for block in blocks]
            assert len(set(ids)) == len(ids), f"request {request_id} holds a block twice"
            holders.update(ids)
        free_queue = self.block_pool.free_block_queue
        for block in self.block_pool.blocks:
            assert block.ref_cnt == holders[block.block_id], (
                f"block {block.block_id}: ref_cnt {block.ref_cnt} but "
                f"{holders[block.block_id]} holders"
            )
            assert not (holders[block.block_id] and block in free_queue), (
                f"block {block.block_id} is both free and held"
            )
        num_used = len(holders)
        assert num_used + self.get_num_free_blocks() == self.num_usable_blocks
