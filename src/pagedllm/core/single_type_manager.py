"""Block tables of one KV cache group: full attention, or a sliding window.

`KVCacheManager` keeps one of these per group (core/kv_cache_groups.py) and asks each the
same questions: how many blocks does growing a request take, which cached blocks can a new
request reuse, which blocks may go. A full-attention group keeps every block of a request;
a sliding-window group replaces the blocks wholly outside the window of the next token with
the null block, returning them to the pool (they keep their prefix-cache hash until
evicted). Cache keys carry the group id, so two groups never share a block.
This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedllm.core.block_hash import BlockHash, hash_with_group_id
from pagedllm.core.block_pool import BlockPool, KVCacheBlock


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (core/ may not import pagedllm.utils)."""
    return -(a // -b)


class FullAttentionManager:
    """Block tables of a full-attention group: a request keeps all its blocks.

    Args:
        block_pool: the pool shared by every group.
        block_size: tokens per block.
        group_id: the group's index (part of its prefix-cache keys).
    """

    def __init__(self, block_pool: BlockPool, block_size: int, group_id: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.group_id = group_id
        self.null_block = block_pool.null_block
        # request_id → its block table, in token order (null blocks where skipped).
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request_id → how many leading blocks of its table went through the cache already.
        self.num_cached_blocks: dict[str, int] = {}

    # ---------------------------------------------------------------- what blocks it takes

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks the next token cannot see (none under full attention)."""
        return 0

    def max_num_blocks(self, num_tokens: int, max_chunk_tokens: int) -> int:
        """The most blocks one request of `num_tokens` tokens holds at once."""
        return cdiv(num_tokens, self.block_size)

    def num_blocks_held(self, num_computed_tokens: int) -> int:
        """Real (non-null) blocks of a request after `remove_skipped_blocks`."""
        return cdiv(num_computed_tokens, self.block_size) - self.num_skipped_blocks(
            num_computed_tokens
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        num_computed_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
    ) -> int:
        """Free blocks that growing the table to `num_tokens` tokens consumes: new blocks
        plus cached hits revived from the free queue."""
        table_len = len(self.req_to_blocks.get(request_id, ())) + len(new_computed_blocks)
        table_len = max(table_len, self.num_skipped_blocks(num_computed_tokens))
        num_new = max(0, cdiv(num_tokens, self.block_size) - table_len)
        num_revived = sum(
            1 for b in new_computed_blocks if b.ref_cnt == 0 and b is not self.null_block
        )
        return num_new + num_revived

    def save_new_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> None:
        """Start a new request's table with its prefix hit, taking a reference to each."""
        self.block_pool.touch(b for b in new_computed_blocks if b is not self.null_block)
        self.req_to_blocks.setdefault(request_id, []).extend(new_computed_blocks)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> list[KVCacheBlock]:
        """Grow the table to hold `num_tokens` tokens; blocks the next token cannot see
        (a sliding window's, for a request that comes back from swap) stay null."""
        table = self.req_to_blocks.setdefault(request_id, [])
        num_skipped = self.num_skipped_blocks(num_computed_tokens)
        if len(table) < num_skipped:
            table.extend([self.null_block] * (num_skipped - len(table)))
        num_new = max(0, cdiv(num_tokens, self.block_size) - len(table))
        new_blocks = self.block_pool.get_new_blocks(num_new)
        table.extend(new_blocks)
        return new_blocks

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks the next token cannot see (nothing under full attention)."""

    # -------------------------------------------------------------------- prefix caching

    def cache_blocks(
        self, request_id: str, block_hashes: Sequence[BlockHash], num_full_blocks: int
    ) -> list[int]:
        """Make the request's first `num_full_blocks` blocks findable by their hashes; the
        indices (block i covers the request's tokens [i * block_size, ...)) of those that
        became findable now."""
        start = self.num_cached_blocks.get(request_id, 0)
        if num_full_blocks <= start:
            return []
        blocks = self.req_to_blocks[request_id][start:num_full_blocks]
        keys = [hash_with_group_id(h, self.group_id) for h in block_hashes[start:num_full_blocks]]
        # A block skipped before it was cached has no contents to share.
        pairs = [(start + i, b, k) for i, (b, k) in enumerate(zip(blocks, keys, strict=True))
                 if b is not self.null_block]
        stored = self.block_pool.cache_full_blocks([b for _, b, _ in pairs],
                                                   [k for _, _, k in pairs])
        self.num_cached_blocks[request_id] = num_full_blocks
        return [pairs[position][0] for position in stored]

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_num_blocks: int
    ) -> list[KVCacheBlock]:
        """The longest run of cached blocks from the first one, at most `max_num_blocks`."""
        blocks: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_num_blocks]:
            block = self.block_pool.get_cached_block(hash_with_group_id(block_hash, self.group_id))
            if block is None:
                break
            blocks.append(block)
        return blocks

    # ------------------------------------------------------------------------- the rest

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """The request's table (empty if it holds none)."""
        return self.req_to_blocks.get(request_id, [])

    def free(self, request_id: str) -> None:
        """Return the request's blocks, tail first (its first blocks are evicted last)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_blocks.pop(request_id, None)
        self.block_pool.free_blocks(b for b in reversed(blocks) if b is not self.null_block)

    def trim(self, request_id: str, num_tokens: int) -> bool:
        """Return the blocks past the first `num_tokens` tokens (speculative slots of
        rejected drafts), tail first; True if any. They were never cached: a block is
        cached only once full of the request's real tokens, all below `num_tokens`."""
        blocks = self.req_to_blocks.get(request_id)
        keep = cdiv(num_tokens, self.block_size)
        if blocks is None or len(blocks) <= keep:
            return False
        assert self.num_cached_blocks.get(request_id, 0) <= keep, "trimming a cached block"
        extra = blocks[keep:]
        del blocks[keep:]
        self.block_pool.free_blocks(b for b in reversed(extra) if b is not self.null_block)
        return True


class SlidingWindowManager(FullAttentionManager):
    """Block tables of a sliding-window group: blocks outside the window are let go.

    The token at position p sees keys at positions > p - window, so once `n` tokens are
    computed, the blocks wholly before position n - window + 1 are never read again.
    """

    def __init__(
        self, block_pool: BlockPool, block_size: int, group_id: int, sliding_window: int
    ) -> None:
        super().__init__(block_pool, block_size, group_id)
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}.")
        self.sliding_window = sliding_window

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks wholly before the window of the token at `num_computed_tokens`."""
        return max(0, num_computed_tokens - self.sliding_window + 1) // self.block_size

    def max_num_blocks(self, num_tokens: int, max_chunk_tokens: int) -> int:
        """A window of keys plus a chunk of new tokens, never more than the tokens need."""
        in_window = cdiv(self.sliding_window - 1 + max_chunk_tokens, self.block_size) + 1
        return min(cdiv(num_tokens, self.block_size), in_window)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Replace the blocks the next token cannot see by the null block, freeing them."""
        table = self.req_to_blocks.get(request_id)
        if not table:
            return
        removed = []
        for index in range(min(self.num_skipped_blocks(num_computed_tokens), len(table)) - 1,
                           -1, -1):
            if table[index] is self.null_block:
                break  # everything before it went at an earlier step
            removed.append(table[index])
            table[index] = self.null_block
        self.block_pool.free_blocks(removed)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_num_blocks: int
    ) -> list[KVCacheBlock]:
        """The longest hit whose last window of blocks is cached; earlier ones are null.

        Searching from the end: a hit of n blocks needs blocks n - k .. n - 1 cached, k =
        cdiv(window - 1, block_size) (what the token at position n * block_size sees), or
        all of blocks 0 .. n - 1 when n < k.
        """
        num_needed = cdiv(self.sliding_window - 1, self.block_size)
        if num_needed == 0:
            return [self.null_block] * max_num_blocks
        hit: list[KVCacheBlock] = [self.null_block] * max_num_blocks
        num_contiguous = 0
        for index in range(max_num_blocks - 1, -1, -1):
            key = hash_with_group_id(block_hashes[index], self.group_id)
            block = self.block_pool.get_cached_block(key)
            if block is None:
                num_contiguous = 0
                continue
            hit[index] = block
            num_contiguous += 1
            if num_contiguous == num_needed:
                return hit[: index + num_needed]
        # Reached the first block with fewer than num_needed in a row: the hit is that run.
        return hit[:num_contiguous]


def make_manager(
    block_pool: BlockPool, block_size: int, group_id: int, sliding_window: int | None
) -> FullAttentionManager:
    """The manager for one group's attention type."""
    if sliding_window is None:
        return FullAttentionManager(block_pool, block_size, group_id)
    return SlidingWindowManager(block_pool, block_size, group_id, sliding_window)
