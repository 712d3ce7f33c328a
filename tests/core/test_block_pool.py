"""BlockPool and FreeBlockQueue: exact block ids, free-queue order and the null block."""

from __future__ import annotations

import pytest

from pagedllm.core.block_pool import NULL_BLOCK_ID, BlockPool, FreeBlockQueue, KVCacheBlock


def free_ids(pool: BlockPool) -> list[int]:
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def test_null_block_is_reserved() -> None:
    pool = BlockPool(5)
    assert pool.null_block.block_id == NULL_BLOCK_ID == 0
    assert pool.num_usable_blocks == 4
    assert pool.get_num_free_blocks() == 4
    assert free_ids(pool) == [1, 2, 3, 4]
    assert ids(pool.get_new_blocks(4)) == [1, 2, 3, 4]
    assert pool.get_num_free_blocks() == 0
    assert pool.get_usage() == 1.0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.check_integrity()


def test_too_few_blocks_rejected() -> None:
    with pytest.raises(ValueError, match="null block"):
        BlockPool(1)
    BlockPool(2).check_integrity()


def test_get_new_blocks_sets_ref_count_and_usage() -> None:
    pool = BlockPool(5)
    assert pool.get_usage() == 0.0
    blocks = pool.get_new_blocks(2)
    assert ids(blocks) == [1, 2]
    assert [block.ref_cnt for block in blocks] == [1, 1]
    assert pool.get_usage() == 0.5
    assert pool.get_new_blocks(0) == []
    with pytest.raises(ValueError):
        pool.get_new_blocks(-1)
    pool.check_integrity()


def test_freed_blocks_join_the_tail_in_the_given_order() -> None:
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)  # 1, 2, 3; queue is [4, 5]
    pool.free_blocks([blocks[1]])
    assert free_ids(pool) == [4, 5, 2]
    pool.free_blocks([blocks[2], blocks[0]])
    assert free_ids(pool) == [4, 5, 2, 3, 1]
    # Least recently freed first.
    assert ids(pool.get_new_blocks(3)) == [4, 5, 2]
    assert free_ids(pool) == [3, 1]
    pool.check_integrity()


def test_shared_block_is_freed_only_at_zero_refs() -> None:
    pool = BlockPool(3)
    (block,) = pool.get_new_blocks(1)
    block.ref_cnt += 1  # a second holder, as prefix caching will do
    pool.free_blocks([block])
    assert block.ref_cnt == 1
    assert free_ids(pool) == [2]
    pool.free_blocks([block])
    assert block.ref_cnt == 0
    assert free_ids(pool) == [2, 1]
    pool.check_integrity()


def test_new_block_forgets_its_hash() -> None:
    pool = BlockPool(2)
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([block], [b"h1"])
    pool.free_blocks([block])
    assert block.block_hash == b"h1"  # kept while free, for a later prefix-cache hit
    assert pool.get_cached_block(b"h1") is block
    pool.check_integrity()
    (again,) = pool.get_new_blocks(1)
    assert again is block and again.block_hash is None
    assert pool.get_cached_block(b"h1") is None and pool.num_evictions == 1
    pool.check_integrity()


def test_integrity_catches_corruption() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    blocks[0].ref_cnt = 0  # used but unreferenced
    with pytest.raises(AssertionError):
        pool.check_integrity()
    blocks[0].ref_cnt = 1
    pool.check_integrity()
    pool.null_block.ref_cnt = 1
    with pytest.raises(AssertionError):
        pool.check_integrity()


def test_free_queue_remove_anywhere() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])  # middle
    queue.remove(blocks[0])  # head
    queue.remove(blocks[4])  # tail
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 3]
    assert len(queue) == 2
    assert blocks[1] in queue and blocks[2] not in queue and blocks[0] not in queue
    queue.append(blocks[0])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 3, 0]
    queue.check_integrity()
    assert [queue.popleft().block_id for _ in range(3)] == [1, 3, 0]
    assert len(queue) == 0 and blocks[0] not in queue
    with pytest.raises(IndexError):
        queue.popleft()
    queue.check_integrity()


def test_free_queue_single_block_and_double_append() -> None:
    block = KVCacheBlock(7)
    queue = FreeBlockQueue()
    assert block not in queue
    queue.append(block)
    assert block in queue
    with pytest.raises(AssertionError):
        queue.append(block)
    assert queue.popleft_n(1) == [block]
    with pytest.raises(IndexError):
        queue.popleft_n(1)
    queue.check_integrity()


def test_reset_prefix_cache_hands_out_low_block_ids_again() -> None:
    """After a reset, allocation restarts from block 1: the blocks already written (on CPU
    the only KV pages that are resident) are reused before untouched ones."""
    pool = BlockPool(num_blocks=10)
    first = pool.get_new_blocks(4)  # ids 1..4
    pool.free_blocks(reversed(first))
    assert [b.block_id for b in pool.get_new_blocks(2)] == [5, 6]  # LRU: fresh ones first
    pool.free_blocks(pool.blocks[5:7])
    assert pool.reset_prefix_cache()
    assert [b.block_id for b in pool.get_new_blocks(3)] == [1, 2, 3]
    pool.check_integrity()
