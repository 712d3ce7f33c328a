"""BlockPool: the mechanism that hands out and takes back KV blocks, with O(1) bookkeeping.

The pool owns every `KVCacheBlock`, an intrusive LRU free queue and the prefix cache's
hash → block map. It knows nothing about requests or tokens: which blocks a request holds,
and how many it needs, is the business of `KVCacheManager`. Block 0 is the *null block*: it
is never handed out, and the worker points the padding of block tables at it, so a pool of
`num_blocks` blocks has `num_blocks - 1` usable ones.

Prefix caching: a full block carries its chained hash and is findable by it. A block whose
reference count drops to zero keeps its hash and stays findable while it sits in the free
queue (`touch` revives it); only when the queue hands it out as a new block is the hash
dropped (lazy LRU eviction). So "free" always includes cached-but-evictable blocks.
This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pagedllm.core.block_hash import BlockHash, is_plain_hash
from pagedllm.core.kv_events import AllBlocksCleared, BlockRemoved, KVEventRecorder

NULL_BLOCK_ID = 0


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One block of the paged KV cache (metadata only; the tensors live in the worker).

    Identity comparison (`eq=False`) is deliberate: two blocks are never "equal" by value.

    Attributes:
        block_id: index of the block in the worker's KV tensors.
        ref_cnt: how many requests hold the block; 0 means it sits in the free queue.
        block_hash: chained hash of the full block's tokens while the block is in the prefix
            cache (findable through `BlockPool.get_cached_block`), else None.
        prev_free_block: previous block in the free queue (None at the head or when not free).
        next_free_block: next block in the free queue (None at the tail or when not free).
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    prev_free_block: KVCacheBlock | None = field(default=None, repr=False)
    next_free_block: KVCacheBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Intrusive doubly linked list of free blocks, in LRU order (head = evicted first).

    The links live in the blocks themselves, so `remove` of an arbitrary block is O(1); a
    prefix cache later uses that to revive a cached free block. Every operation is O(1)
    per block.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()) -> None:
        self._head: KVCacheBlock | None = None
        self._tail: KVCacheBlock | None = None
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __contains__(self, block: KVCacheBlock) -> bool:
        # Every queued block but the head has a predecessor, so this is O(1).
        return block.prev_free_block is not None or self._head is block

    def popleft(self) -> KVCacheBlock:
        """Remove and return the least recently freed block."""
        block = self._head
        if block is None:
            raise IndexError("popleft from an empty FreeBlockQueue")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the `n` least recently freed blocks, oldest first."""
        if n > self.num_free_blocks:
            raise IndexError(f"cannot pop {n} blocks from {self.num_free_blocks} free ones")
        return [self.popleft() for _ in range(n)]

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail (it will be reused last)."""
        assert block not in self, f"block {block.block_id} is already free"
        block.prev_free_block = self._tail
        block.next_free_block = None
        if self._tail is None:
            self._head = block
        else:
            self._tail.next_free_block = block
        self._tail = block
        self.num_free_blocks += 1

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block`, wherever it is in the queue."""
        assert block in self, f"block {block.block_id} is not free"
        prev_block, next_block = block.prev_free_block, block.next_free_block
        if prev_block is None:
            self._head = next_block
        else:
            prev_block.next_free_block = next_block
        if next_block is None:
            self._tail = prev_block
        else:
            next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head to tail (O(n); for checks and tests)."""
        blocks = []
        block = self._head
        while block is not None:
            blocks.append(block)
            block = block.next_free_block
        return blocks

    def check_integrity(self) -> None:
        """Assert that links agree both ways and the count matches the list."""
        blocks = self.get_all_free_blocks()
        assert len(blocks) == self.num_free_blocks, "free count does not match the list"
        assert len({id(b) for b in blocks}) == len(blocks), "a block is queued twice"
        assert (self._head is None) == (self._tail is None) == (not blocks)
        prev_block = None
        for block in blocks:
            assert block.prev_free_block is prev_block, f"broken link at {block.block_id}"
            prev_block = block
        assert self._tail is prev_block, "tail is not the last block"


class BlockPool:
    """Owns all KV blocks: hands out free ones, takes back released ones, caches full ones.

    Block 0 is the null block (never handed out, never freed), so `num_blocks - 1` blocks are
    usable. Newly freed blocks go to the tail of the free queue and allocation pops from the
    head, so the least recently freed block is reused (and its cached hash evicted) first.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be at least 2 (block 0 is the reserved null block), "
                f"got {num_blocks}."
            )
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(block_id) for block_id in range(num_blocks)]
        self.null_block = self.blocks[NULL_BLOCK_ID]
        self.free_block_queue = FreeBlockQueue(self.blocks[NULL_BLOCK_ID + 1 :])
        # The prefix cache: one block per hash. A second block with the same contents (e.g.
        # a recomputed last prompt block) simply stays uncached.
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        self.num_evictions = 0
        # KV cache events (core/kv_events.py) when asked for: None records nothing.
        self.kv_events: KVEventRecorder | None = None

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be handed out (all but the null block)."""
        return self.num_blocks - 1

    def get_num_free_blocks(self) -> int:
        """Blocks that `get_new_blocks` can hand out now (cached-but-unused ones included)."""
        return self.free_block_queue.num_free_blocks

    def get_num_cached_blocks(self) -> int:
        """Blocks findable by hash (used or free)."""
        return len(self.cached_block_hash_to_block)

    def get_usage(self) -> float:
        """Share of usable blocks in use, in [0, 1]."""
        return 1.0 - self.get_num_free_blocks() / self.num_usable_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` blocks from the head of the free queue, each with ref_cnt 1.

        A taken block that was still cached loses its hash: its contents will be overwritten.

        Raises:
            ValueError: if `num_blocks` is negative or more than are free.
        """
        if not 0 <= num_blocks <= self.get_num_free_blocks():
            raise ValueError(
                f"cannot get {num_blocks} blocks: {self.get_num_free_blocks()} are free."
            )
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            assert block.ref_cnt == 0, f"free block {block.block_id} has ref_cnt {block.ref_cnt}"
            block.ref_cnt = 1
            self._evict(block)
        return blocks

    def _evict(self, block: KVCacheBlock) -> None:
        """Drop `block` from the prefix cache (a no-op if it is not cached)."""
        if block.block_hash is None:
            return
        removed = self.cached_block_hash_to_block.pop(block.block_hash)
        assert removed is block, f"hash of block {block.block_id} maps to another block"
        if self.kv_events is not None and is_plain_hash(block.block_hash):
            self.kv_events.record(BlockRemoved([block.block_hash]))
        block.block_hash = None
        self.num_evictions += 1

    def uncache(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop `blocks` from the prefix cache (they stay held; uncached ones are skipped)."""
        for block in blocks:
            if block is not self.null_block:
                self._evict(block)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The block cached under `block_hash` (used or free), or None."""
        return self.cached_block_hash_to_block.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add a holder to each (cached) block, reviving free ones out of the free queue."""
        for block in blocks:
            assert block is not self.null_block, "the null block is never handed out"
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_blocks(
        self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[BlockHash]
    ) -> list[int]:
        """Make full, held `blocks` findable by their hashes (pairwise); the positions (in
        `blocks`) of those that became findable now.

        A block already cached keeps its hash (it must be the same one). A block whose hash
        another block already holds stays uncached: the cache keeps one block per hash.
        """
        assert len(blocks) == len(block_hashes)
        stored = []
        for index, (block, block_hash) in enumerate(zip(blocks, block_hashes, strict=True)):
            assert block.ref_cnt > 0, f"block {block.block_id} is cached while free"
            if block.block_hash is not None:
                assert block.block_hash == block_hash, f"block {block.block_id} changed hash"
                continue
            if block_hash in self.cached_block_hash_to_block:
                continue
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block
            stored.append(index)
        return stored

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the free-queue tail.

        Blocks are appended in the order given, so the caller decides which are reused
        first (`KVCacheManager` passes a request's blocks tail first). Cached blocks keep
        their hash in the free queue until they are handed out again.
        """
        for block in blocks:
            assert block is not self.null_block, "the null block is never freed"
            assert block.ref_cnt > 0, f"block {block.block_id} freed more often than taken"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use."""
        if self.get_num_free_blocks() != self.num_usable_blocks:
            return False
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        if self.kv_events is not None:
            self.kv_events.record(AllBlocksCleared())
        # Back to block-id order, as at start: blocks are handed out from the low ids again,
        # which are the ones already written. On CPU the cache's memory pages only become
        # resident when first written, so this keeps repeated runs at one run's footprint.
        usable = self.blocks[NULL_BLOCK_ID + 1 :]
        for block in usable:  # unlink them all from the old queue first
            block.prev_free_block = block.next_free_block = None
        self.free_block_queue = FreeBlockQueue(usable)
        return True

    def check_integrity(self) -> None:
        """Assert: free blocks have ref_cnt 0, used blocks > 0, the null block is untouched,
        and the hash map and the blocks' hashes agree both ways."""
        self.free_block_queue.check_integrity()
        assert self.null_block not in self.free_block_queue, "the null block is in the queue"
        assert self.null_block.ref_cnt == 0, "the null block was handed out"
        assert self.null_block.block_hash is None, "the null block is cached"
        num_used = 0
        for block in self.blocks[NULL_BLOCK_ID + 1 :]:
            if block in self.free_block_queue:
                assert block.ref_cnt == 0, f"free block {block.block_id} is referenced"
            else:
                assert block.ref_cnt > 0, f"block {block.block_id} is neither free nor used"
                num_used += 1
            if block.block_hash is not None:
                assert self.cached_block_hash_to_block.get(block.block_hash) is block, (
                    f"block {block.block_id} has a hash the cache does not map to it"
                )
        for block_hash, block in self.cached_block_hash_to_block.items():
            assert block.block_hash == block_hash, f"cache entry of block {block.block_id}"
        assert num_used + self.get_num_free_blocks() == self.num_usable_blocks
