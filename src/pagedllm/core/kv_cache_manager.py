"""KVCacheManager: the policy layer over BlockPool, tracking each request's block table.

It answers "can this request grow by N tokens?" by allocating blocks (or returning None),
finds a new request's longest cached prefix (automatic prefix caching), and frees a
request's blocks when it ends or is preempted. It does not decide who runs: that is the
scheduler's job, and the scheduler reaches blocks only through this class.
This module must not import torch or anything outside `core/`.

Prefix caching, in short: every full block is identified by a chained hash of its tokens
(core/block_hash.py). `get_computed_blocks` walks a request's hashes through the pool's
hash → block map and returns the longest run of cached blocks; `allocate_slots` takes those
blocks (a reference each) and caches every block that becomes full with the tokens
scheduled this step, *at allocation time*, before the worker has computed their KV. That
lets a second request admitted in the same step (an `n` > 1 sibling, an identical prompt)
share the blocks at once. It is safe because of an invariant of the attention backends
(attention/torch_paged.py `forward`): each layer writes the K/V of every token of the batch
into the cache before it computes any attention, so a request reading a block that another
request fills in the same step sees the block's final contents; and the scheduler never
preempts or frees a request between scheduling it and the step that computes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pagedllm.core.block_hash import update_request_block_hashes
from pagedllm.core.block_pool import BlockPool, KVCacheBlock
from pagedllm.request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (core/ may not import pagedllm.utils)."""
    return -(a // -b)


class KVCacheManager:
    """Allocates and frees KV blocks per request, sharing cached prefix blocks.

    Args:
        num_blocks: blocks in the pool, including the reserved null block 0.
        block_size: tokens per block.
        enable_caching: automatic prefix caching on or off.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}.")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks)
        # request_id → its block table, in token order.
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request_id → how many leading blocks of its table went through the cache already.
        self.num_cached_blocks: dict[str, int] = {}
        # Cumulative prefix-cache lookups at admission, in tokens (vLLM's queries / hits).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be handed to requests (all but the null block)."""
        return self.block_pool.num_usable_blocks

    @property
    def usage(self) -> float:
        """Share of usable blocks in use, in [0, 1] (cached-but-free blocks count as free)."""
        return self.block_pool.get_usage()

    def get_num_free_blocks(self) -> int:
        """Blocks free now, cached-but-evictable ones included."""
        return self.block_pool.get_num_free_blocks()

    def get_num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return cdiv(num_tokens, self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached blocks that starts `request`'s tokens.

        The hit is capped at `num_tokens - 1` tokens: the last token is always computed,
        because its logits are needed to sample. Nothing is taken yet: pass the blocks to
        `allocate_slots` as `new_computed_blocks`.

        Returns:
            (blocks, num_computed_tokens) with num_computed_tokens = len(blocks) * block_size.
        """
        # Prompt logprobs need every prompt position computed (SamplingParams says when).
        if not self.enable_caching or request.sampling_params.skip_reading_prefix_cache:
            return [], 0
        assert request.request_id not in self.req_to_blocks, "lookup for a request with blocks"
        block_hashes = update_request_block_hashes(request, self.block_size)
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_num_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def _num_blocks_to_take(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> tuple[int, int]:
        """(new blocks to allocate, free blocks that allocation consumes in all)."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_tokens = (
            request.num_computed_tokens
            + len(new_computed_blocks) * self.block_size
            + num_new_tokens
        )
        num_new_blocks = max(
            0, self.get_num_blocks_needed(num_tokens) - len(blocks) - len(new_computed_blocks)
        )
        # Reviving a cached block that is free takes it out of the free queue too.
        num_revived = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        return num_new_blocks, num_new_blocks + num_revived

    def can_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> bool:
        """True if `allocate_slots` with the same arguments would succeed now."""
        _, num_consumed = self._num_blocks_to_take(request, num_new_tokens, new_computed_blocks)
        return num_consumed <= self.get_num_free_blocks()

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] | None = None,
    ) -> list[int] | None:
        """Grow `request`'s block table so it holds KV for `num_new_tokens` more tokens.

        Args:
            request: the request; its `num_computed_tokens` is not changed here.
            num_new_tokens: tokens to compute this step.
            new_computed_blocks: at admission, the prefix hit from `get_computed_blocks`
                (possibly empty): these blocks start the table and their tokens count as
                computed. None when the request is not being admitted with a lookup.

        Returns:
            The ids of the blocks appended after the prefix hit (possibly empty), or None if
            too few blocks are free; on None nothing is changed.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be non-negative, got {num_new_tokens}.")
        computed = list(new_computed_blocks or ())
        if computed:
            assert request.request_id not in self.req_to_blocks, "prefix hit for a known request"
            assert request.num_computed_tokens == 0, "prefix hit for a computed request"
        num_new_blocks, num_consumed = self._num_blocks_to_take(request, num_new_tokens, computed)
        if num_consumed > self.get_num_free_blocks():
            return None
        self.block_pool.touch(computed)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        self.req_to_blocks.setdefault(request.request_id, []).extend(computed + new_blocks)
        num_cached_tokens = len(computed) * self.block_size
        if new_computed_blocks is not None and self.enable_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_cached_tokens
        if self.enable_caching:
            num_tokens = request.num_computed_tokens + num_cached_tokens + num_new_tokens
            self._cache_full_blocks(request, num_tokens)
        return [block.block_id for block in new_blocks]

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that are full once its first `num_tokens` are computed."""
        num_full_blocks = min(num_tokens, request.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(request.request_id, 0)
        if num_full_blocks <= start:
            return
        block_hashes = update_request_block_hashes(request, self.block_size)
        blocks = self.req_to_blocks[request.request_id]
        self.block_pool.cache_full_blocks(
            blocks[start:num_full_blocks], block_hashes[start:num_full_blocks]
        )
        self.num_cached_blocks[request.request_id] = num_full_blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        """A copy of the request's block table (empty if it holds no blocks)."""
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def get_request_ids(self) -> set[str]:
        """Ids of the requests that hold a block table."""
        return set(self.req_to_blocks)

    def free(self, request: Request) -> None:
        """Return all of `request`'s blocks to the pool (a no-op if it holds none).

        Blocks are freed tail first, so a request's last blocks are evicted before its first
        ones: a shared prefix survives longest. Cached blocks stay findable until evicted.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request holds blocks."""
        return self.block_pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Assert: free + used == total, ref counts == holders, no block both free and held."""
        self.block_pool.check_integrity()
        holders: Counter[int] = Counter()
        for request_id, blocks in self.req_to_blocks.items():
            ids = [block.block_id for block in blocks]
            assert len(set(ids)) == len(ids), f"request {request_id} holds a block twice"
            holders.update(ids)
            assert self.num_cached_blocks.get(request_id, 0) <= len(blocks)
        assert set(self.num_cached_blocks) <= set(self.req_to_blocks)
        free_queue = self.block_pool.free_block_queue
        for block in self.block_pool.blocks:
            assert block.ref_cnt == holders[block.block_id], (
                f"block {block.block_id}: ref_cnt {block.ref_cnt} but "
                f"{holders[block.block_id]} holders"
            )
            assert not (holders[block.block_id] and block in free_queue), (
                f"block {block.block_id} is both free and held"
            )
        if not self.enable_caching:
            assert self.block_pool.get_num_cached_blocks() == 0, "caching is off"
        assert self.prefix_cache_hits <= self.prefix_cache_queries
        num_used = len(holders)
        assert num_used + self.get_num_free_blocks() == self.num_usable_blocks
