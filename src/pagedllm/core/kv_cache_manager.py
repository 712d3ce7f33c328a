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

KV cache groups (core/kv_cache_groups.py): a hybrid model keeps one block table per group
per request, all from one pool. Block ids travel as a tuple of lists, one per group (a
1-tuple for most models). A sliding-window group frees the blocks that left its window
(core/single_type_manager.py); a prefix hit is the longest length every group can serve.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pagedllm.core.block_hash import BlockHash, update_request_block_hashes
from pagedllm.core.block_pool import BlockPool, KVCacheBlock
from pagedllm.core.kv_cache_groups import KVCacheGroupSpec
from pagedllm.core.kv_events import BlockStored, KVEventRecorder
from pagedllm.core.single_type_manager import FullAttentionManager, make_manager
from pagedllm.request import Request

__all__ = ["BlockIds", "KVCacheBlocks", "KVCacheManager"]

# One list per KV cache group, in group order.
KVCacheBlocks = tuple[list[KVCacheBlock], ...]
BlockIds = tuple[list[int], ...]


class KVCacheManager:
    """Allocates and frees KV blocks per request, sharing cached prefix blocks.

    Args:
        num_blocks: blocks in the pool, including the reserved null block 0.
        block_size: tokens per block.
        enable_caching: automatic prefix caching on or off.
        groups: the KV cache groups (None: one full-attention group).
        max_chunk_tokens: the most tokens one request computes in a step (the scheduler's
            token budget), for the peak block count of a sliding-window group.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        groups: Sequence[KVCacheGroupSpec] | None = None,
        max_chunk_tokens: int | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}.")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks)
        self.groups = tuple(groups) if groups else (KVCacheGroupSpec(()),)
        self.managers: list[FullAttentionManager] = [
            make_manager(self.block_pool, block_size, group_id, group.sliding_window)
            for group_id, group in enumerate(self.groups)
        ]
        self.max_chunk_tokens = max_chunk_tokens
        # Cumulative prefix-cache lookups at admission, in tokens (vLLM's queries / hits).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_groups(self) -> int:
        """KV cache groups (block tables per request)."""
        return len(self.managers)

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
        """The most blocks, over all groups, one request of `num_tokens` tokens holds."""
        chunk = num_tokens if self.max_chunk_tokens is None else self.max_chunk_tokens
        return sum(m.max_num_blocks(num_tokens, chunk) for m in self.managers)

    def get_num_blocks_held(self, num_computed_tokens: int) -> int:
        """Real blocks, over all groups, of a request with that many tokens computed once
        the blocks outside its windows are gone (what a swap-out copies)."""
        return sum(m.num_blocks_held(num_computed_tokens) for m in self.managers)

    def empty_blocks(self) -> KVCacheBlocks:
        """No blocks in any group (a prefix miss)."""
        return tuple([] for _ in self.managers)

    def block_hashes(self, request: Request) -> list[BlockHash]:
        """The hashes of all of `request`'s full blocks (computed on first need, with or
        without prefix caching: a KV connector names blocks by them)."""
        return update_request_block_hashes(request, self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of `request`'s tokens that every group can serve.

        The hit is capped at `num_tokens - 1` tokens: the last token is always computed,
        because its logits are needed to sample. Nothing is taken yet: pass the blocks to
        `allocate_slots` as `new_computed_blocks`.

        Returns:
            (blocks per group, num_computed_tokens) with num_computed_tokens a whole number
            of blocks; a sliding-window group's blocks before its window are null.
        """
        # Prompt logprobs need every prompt position computed (SamplingParams says when).
        if not self.enable_caching or request.sampling_params.skip_reading_prefix_cache:
            return self.empty_blocks(), 0
        assert request.request_id not in self.managers[0].req_to_blocks, "lookup with blocks"
        block_hashes = update_request_block_hashes(request, self.block_size)
        num_blocks = (request.num_tokens - 1) // self.block_size
        # Shrink the length until every group serves exactly it: a full-attention hit holds
        # for any shorter length, a sliding one must be searched again.
        while True:
            hits = [m.find_longest_cache_hit(block_hashes, num_blocks) for m in self.managers]
            shortest = min(len(hit) for hit in hits)
            if all(len(hit) == num_blocks for hit in hits):
                return tuple(hits), num_blocks * self.block_size
            num_blocks = shortest

    def _num_blocks_to_take(
        self, request: Request, num_new_tokens: int, computed: KVCacheBlocks
    ) -> int:
        """Free blocks that growing `request` by `num_new_tokens` after its hit consumes."""
        num_computed = request.num_computed_tokens + len(computed[0]) * self.block_size
        num_tokens = num_computed + num_new_tokens
        return sum(
            m.get_num_blocks_to_allocate(request.request_id, num_tokens, num_computed, blocks)
            for m, blocks in zip(self.managers, computed, strict=True)
        )

    def get_num_blocks_to_grow(self, request: Request, num_new_tokens: int) -> int:
        """Free blocks that growing the running `request` by `num_new_tokens` consumes."""
        return self._num_blocks_to_take(request, num_new_tokens, self.empty_blocks())

    def can_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> bool:
        """True if `allocate_slots` with the same arguments would succeed now."""
        computed = new_computed_blocks or self.empty_blocks()
        num_needed = self._num_blocks_to_take(request, num_new_tokens, computed)
        return num_needed <= self.get_num_free_blocks()

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
        cache_new_blocks: bool = True,
    ) -> BlockIds | None:
        """Grow `request`'s block tables so they hold KV for `num_new_tokens` more tokens.

        First frees the blocks that left a sliding window (they are never read again).

        Args:
            request: the request; its `num_computed_tokens` is not changed here.
            num_new_tokens: tokens to compute this step.
            new_computed_blocks: at admission, the prefix hit from `get_computed_blocks`
                (possibly empty): these blocks start the tables and their tokens count as
                computed. None when the request is not being admitted with a lookup.
            cache_new_blocks: make the blocks that become full findable in the prefix
                cache now (False: their KV arrives later, from a KV connector's
                asynchronous load; the allocation after it caches them).

        Returns:
            Per group, the ids of the blocks appended after the prefix hit (possibly empty),
            or None if too few blocks are free; on None no block was taken.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be non-negative, got {num_new_tokens}.")
        computed = new_computed_blocks or self.empty_blocks()
        num_hit = len(computed[0]) * self.block_size
        request_id = request.request_id
        if num_hit:
            assert request_id not in self.managers[0].req_to_blocks, "hit for a known request"
            assert request.num_computed_tokens == 0, "prefix hit for a computed request"
        self.remove_skipped_blocks(request)
        if not self.can_allocate(request, num_new_tokens, computed):
            return None
        num_computed = request.num_computed_tokens + num_hit
        num_tokens = num_computed + num_new_tokens
        # Every group takes its hits before any allocates: a hit may sit in the free queue,
        # where another group's new blocks would otherwise take it.
        for manager, blocks in zip(self.managers, computed, strict=True):
            manager.save_new_computed_blocks(request_id, blocks)
        new_block_ids = []
        for manager in self.managers:
            new_blocks = manager.allocate_new_blocks(request_id, num_tokens, num_computed)
            new_block_ids.append([block.block_id for block in new_blocks])
        if self.enable_caching and new_computed_blocks is not None:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_hit
        if self.enable_caching and cache_new_blocks:
            block_hashes = update_request_block_hashes(request, self.block_size)
            num_full_blocks = min(num_tokens, request.num_tokens) // self.block_size
            for manager in self.managers:
                stored = manager.cache_blocks(request_id, block_hashes, num_full_blocks)
                if manager.group_id == 0 and stored and self.block_pool.kv_events is not None:
                    self._record_stored(request, block_hashes, stored)
        return tuple(new_block_ids)

    def enable_kv_events(self) -> KVEventRecorder:
        """Record KV cache events from now on (core/kv_events.py); the recorder to read."""
        recorder = KVEventRecorder()
        self.block_pool.kv_events = recorder
        return recorder

    def _record_stored(self, request: Request, hashes: Sequence[BlockHash],
                       indices: list[int]) -> None:
        """One BlockStored per run of consecutive newly findable blocks of `request`."""
        recorder = self.block_pool.kv_events
        assert recorder is not None
        size = self.block_size
        lora = request.lora_request
        runs: list[list[int]] = []
        for index in indices:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            first, last = run[0], run[-1]
            recorder.record(BlockStored(
                block_hashes=[hashes[i] for i in run],
                parent_block_hash=hashes[first - 1] if first > 0 else None,
                token_ids=list(request.all_token_ids[first * size:(last + 1) * size]),
                block_size=size,
                lora_id=lora.lora_int_id if lora is not None else None,
                lora_name=lora.lora_name if lora is not None else None,
            ))

    def remove_skipped_blocks(self, request: Request) -> None:
        """Free the blocks no sliding-window layer will read again for `request`."""
        for manager in self.managers:
            manager.remove_skipped_blocks(request.request_id, request.num_computed_tokens)

    def trim(self, request: Request) -> int | None:
        """Free the blocks past `request`'s computed tokens: after a speculative step
        they held only the slots of rejected draft tokens.

        Returns:
            The length of its block tables (the same in every group) if any was cut,
            else None.
        """
        cut = [m.trim(request.request_id, request.num_computed_tokens) for m in self.managers]
        if not any(cut):
            return None
        lengths = {len(m.get_blocks(request.request_id)) for m in self.managers}
        assert len(lengths) == 1, "groups disagree on a request's table length"
        return lengths.pop()

    def get_block_ids(self, request_id: str) -> BlockIds:
        """Copies of the request's block tables, one per group (0 where a block was let
        go; empty lists if it holds none)."""
        return tuple([b.block_id for b in m.get_blocks(request_id)] for m in self.managers)

    def get_request_ids(self) -> set[str]:
        """Ids of the requests that hold block tables."""
        return set(self.managers[0].req_to_blocks)

    def free(self, request: Request) -> None:
        """Return all of `request`'s blocks to the pool (a no-op if it holds none).

        Blocks are freed tail first, so a request's last blocks are evicted before its first
        ones: a shared prefix survives longest. Cached blocks stay findable until evicted.
        """
        for manager in self.managers:
            manager.free(request.request_id)

    def forget_cached_blocks(self, request: Request) -> None:
        """Drop from the prefix cache the blocks `request` alone holds (its KV is not to be
        trusted, e.g. after a non-finite forward). Blocks it shares were computed by, and
        are in use by, other requests too: they stay."""
        for manager in self.managers:
            self.block_pool.uncache(b for b in manager.get_blocks(request.request_id)
                                    if b.ref_cnt == 1)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request holds blocks."""
        return self.block_pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Assert: free + used == total, ref counts == holders, no block both free and held."""
        self.block_pool.check_integrity()
        null_block = self.block_pool.null_block
        holders: Counter[int] = Counter()
        request_ids = self.get_request_ids()
        for manager in self.managers:
            assert set(manager.req_to_blocks) == request_ids, "groups disagree on requests"
            assert set(manager.num_cached_blocks) <= request_ids
            for request_id, blocks in manager.req_to_blocks.items():
                assert manager.num_cached_blocks.get(request_id, 0) <= len(blocks)
                holders.update(b.block_id for b in blocks if b is not null_block)
        for request_id in request_ids:
            ids = [i for table in self.get_block_ids(request_id) for i in table if i]
            assert len(set(ids)) == len(ids), f"request {request_id} holds a block twice"
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
