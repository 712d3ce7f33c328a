"""Automatic prefix caching: chained hashes, hits, the hit cap, eviction order, touch/revive,
reset, statistics, and sharing between requests admitted in the same step.

Exact block ids and free-queue orders, with tiny blocks, in the manner of vLLM's
tests/v1/core/test_prefix_caching.py (our own cases).
"""

from __future__ import annotations

import pytest

from pagedllm.config import CacheConfig, SchedulerConfig
from pagedllm.core.block_hash import (
    NONE_HASH,
    hash_block_tokens,
    update_request_block_hashes,
)
from pagedllm.core.kv_cache_groups import KVCacheCapacity
from pagedllm.core.kv_cache_manager import KVCacheManager
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.step_plan import StepPlan
from pagedllm.request import Request, RequestData
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.outputs import ModelRunnerOutput


def make_request(request_id: str, token_ids: list[int], max_tokens: int = 4) -> Request:
    return Request(request_id, RequestData(list(token_ids), SamplingParams(max_tokens=max_tokens)))


def free_ids(manager: KVCacheManager) -> list[int]:
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


def cached_ids(manager: KVCacheManager) -> list[int]:
    return sorted(b.block_id for b in manager.block_pool.cached_block_hash_to_block.values())


def admit(
    manager: KVCacheManager, request: Request, num_new_tokens: int | None = None
) -> list[int]:
    """Look up the prefix, allocate the rest, mark the request computed; return its table
    (of the one KV cache group)."""
    blocks, num_cached = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - num_cached
    assert manager.allocate_slots(request, num_new_tokens, blocks) is not None
    request.num_computed_tokens = num_cached + num_new_tokens
    manager.check_integrity()
    return manager.get_block_ids(request.request_id)[0]


# ------------------------------------------------------------------------------ hashing


def test_block_hash_is_chained_and_stable() -> None:
    first = hash_block_tokens(None, [1, 2])
    assert first == hash_block_tokens(NONE_HASH, [1, 2]) == hash_block_tokens(None, (1, 2))
    assert len(first) == 32  # a full SHA-256 digest: collisions are not a practical concern
    assert hash_block_tokens(first, [3, 4]) != hash_block_tokens(None, [3, 4])  # parent counts
    assert hash_block_tokens(None, [1, 2], (7,)) != first  # extra keys (e.g. a LoRA id) count
    assert hash_block_tokens(None, [1, 2], ("a",)) != hash_block_tokens(None, [1, 2], ("b",))
    assert hash_block_tokens(None, [12]) != hash_block_tokens(None, [1, 2])
    # Large and negative-free ids encode without loss.
    assert hash_block_tokens(None, [2**40]) != hash_block_tokens(None, [2**40 + 1])


def test_request_hashes_only_full_blocks_incrementally() -> None:
    request = make_request("a", [1, 2, 3, 4, 5])
    hashes = update_request_block_hashes(request, block_size=2)
    assert hashes == [hash_block_tokens(None, [1, 2]), hash_block_tokens(hashes[0], [3, 4])]
    request.append_output_token_ids([6])
    assert len(update_request_block_hashes(request, block_size=2)) == 3
    assert request.block_hashes[2] == hash_block_tokens(hashes[1], [5, 6])


# ------------------------------------------------------------------------------- manager


def test_hit_shares_blocks_and_counts_stats() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=4)
    a = make_request("a", list(range(10)))
    assert admit(manager, a) == [1, 2, 3]
    assert cached_ids(manager) == [1, 2]  # block 3 holds only 2 tokens
    b = make_request("b", list(range(8)) + [50, 51, 52])
    blocks, num_cached = manager.get_computed_blocks(b)
    assert ([blk.block_id for blk in blocks[0]], num_cached) == ([1, 2], 8)
    assert manager.allocate_slots(b, 3, blocks) == ([4],)
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert [manager.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert (manager.prefix_cache_queries, manager.prefix_cache_hits) == (21, 8)
    # Shared blocks count once: 4 of 7 usable blocks are in use.
    assert manager.get_num_free_blocks() == 3
    manager.check_integrity()


def test_hit_is_capped_so_the_last_token_is_computed() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=4)
    admit(manager, make_request("a", list(range(9))))  # blocks 1, 2 full and cached
    # Whole prompt cached (8 tokens = 2 full blocks): only 1 block may hit, the last block is
    # recomputed, since its last token's logits are needed.
    same = make_request("same", list(range(8)))
    assert manager.get_computed_blocks(same)[1] == 4
    # One more token: both blocks hit and only that token is computed.
    longer = make_request("longer", list(range(9)))
    assert manager.get_computed_blocks(longer)[1] == 8
    assert admit(manager, same) == [1, 4]
    # Block 4 holds the same tokens as block 2: the cache keeps one block per hash.
    assert manager.block_pool.blocks[4].block_hash is None
    assert cached_ids(manager) == [1, 2]


def test_freed_blocks_stay_cached_and_are_evicted_lru_tail_first() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    assert admit(manager, a) == [1, 2, 3]
    manager.free(a)
    # Freed tail first, behind the never-used blocks; 1 and 2 keep their hashes.
    assert free_ids(manager) == [4, 5, 3, 2, 1]
    assert cached_ids(manager) == [1, 2]
    assert manager.usage == 0.0  # cached-but-free blocks count as free
    b = make_request("b", [1, 2, 3, 4, 9])
    assert admit(manager, b) == [1, 2, 4]  # 1 and 2 revived (touched), 4 is new
    assert free_ids(manager) == [5, 3]
    manager.free(b)
    assert free_ids(manager) == [5, 3, 4, 2, 1]
    # New blocks come from the head: 5 and 3 (uncached), then 4, then 2 is evicted.
    c = make_request("c", [7, 7, 7, 7, 7, 7, 7, 7])
    assert admit(manager, c) == [5, 3, 4, 2]
    # c's 4 full blocks are cached too; block 2 now holds c's tokens, not a's [3, 4].
    assert cached_ids(manager) == [1, 2, 3, 4, 5]
    assert manager.block_pool.blocks[2].block_hash == c.block_hashes[3]
    assert manager.block_pool.num_evictions == 1
    d = make_request("d", [1, 2, 3, 4, 10])
    blocks, num_cached = manager.get_computed_blocks(d)
    assert ([blk.block_id for blk in blocks[0]], num_cached) == ([1], 2)


def test_touch_revives_a_free_cached_block() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", [1, 2, 3])
    admit(manager, a)
    manager.free(a)
    pool = manager.block_pool
    block = pool.get_cached_block(hash_block_tokens(None, [1, 2]))
    assert block is pool.blocks[1] and block.ref_cnt == 0 and block in pool.free_block_queue
    pool.touch([block])
    assert block.ref_cnt == 1 and block not in pool.free_block_queue
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free_blocks([block, block])
    assert free_ids(manager) == [3, 2, 1]
    pool.check_integrity()


def test_allocation_counts_revived_blocks_against_free_space() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(manager, a)  # all 3 usable blocks
    manager.free(a)
    b = make_request("b", [1, 2, 3, 4, 6, 7, 8])  # hits 2 free cached blocks, needs 2 more
    blocks, _ = manager.get_computed_blocks(b)
    assert not manager.can_allocate(b, 3, blocks)
    assert manager.allocate_slots(b, 3, blocks) is None
    assert free_ids(manager) == [3, 2, 1] and cached_ids(manager) == [1, 2]
    assert manager.can_allocate(b, 2, blocks)
    manager.check_integrity()


def test_reset_prefix_cache_only_when_idle() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(manager, a)
    assert manager.reset_prefix_cache() is False
    assert cached_ids(manager) == [1, 2]
    manager.free(a)
    assert manager.reset_prefix_cache() is True
    assert cached_ids(manager) == []
    assert manager.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5])) == (([],), 0)
    manager.check_integrity()


def test_caching_disabled() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=2, enable_caching=False)
    admit(manager, make_request("a", [1, 2, 3, 4, 5]))
    assert cached_ids(manager) == []
    assert manager.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5])) == (([],), 0)
    assert (manager.prefix_cache_queries, manager.prefix_cache_hits) == (0, 0)


# ----------------------------------------------------------------------------- scheduler


def make_scheduler(
    num_blocks: int = 16, block_size: int = 4, enable_prefix_caching: bool = True, **kwargs
) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, **kwargs)
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    return Scheduler(config, cache, KVCacheCapacity(num_blocks))


def test_siblings_admitted_in_one_step_share_the_prompt() -> None:
    # n > 1 runs as n core requests with the same prompt: blocks cached at allocation let
    # the later siblings hit the first one's blocks in the very same step.
    scheduler = make_scheduler()
    prompt = list(range(100, 110))
    for index in range(3):
        scheduler.add_request(make_request(f"{index}_r", prompt))
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"0_r": 10, "1_r": 2, "2_r": 2}
    tables = {
        new.request_id: (new.block_ids, new.num_computed_tokens)
        for new in output.scheduled_new_reqs
    }
    assert tables == {
        "0_r": (([1, 2, 3],), 0), "1_r": (([1, 2, 4],), 8), "2_r": (([1, 2, 5],), 8)
    }
    # The KV budget counts the shared prompt blocks once: 5 blocks for 3 x 10 tokens.
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 15 - 5
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (30, 16)
    assert stats.num_computed_prompt_tokens == 14
    assert [scheduler.requests[r].num_cached_tokens for r in ("0_r", "1_r", "2_r")] == [0, 8, 8]
    scheduler.check_integrity()


def test_second_run_of_a_shared_prefix_computes_only_new_tokens() -> None:
    scheduler = make_scheduler()
    system = list(range(200, 212))  # 3 full blocks
    first = make_request("first", system + [1, 2])
    scheduler.add_request(first)
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"first": 14}
    scheduler.abort_requests("first")  # frees its blocks; they stay cached
    second = make_request("second", system + [3, 4, 5])
    scheduler.add_request(second)
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"second": 3}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 12
    assert scheduler.num_computed_prompt_tokens == 14 + 3


def test_prefix_caching_off_shares_nothing() -> None:
    scheduler = make_scheduler(enable_prefix_caching=False)
    for index in range(2):
        scheduler.add_request(make_request(str(index), list(range(10))))
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"0": 10, "1": 10}
    assert scheduler.make_stats().prefix_cache_queries == 0


def test_scheduler_reset_prefix_cache() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", list(range(10))))
    scheduler.schedule()
    assert scheduler.reset_prefix_cache() is False
    scheduler.abort_requests("a")
    assert scheduler.reset_prefix_cache() is True
    scheduler.add_request(make_request("b", list(range(10))))
    assert scheduler.schedule().num_scheduled_tokens == {"b": 10}


@pytest.mark.parametrize("block_size", [1, 3])
def test_resumed_request_reuses_its_own_blocks(block_size: int) -> None:
    # After a recompute preemption the request's freed blocks are still cached, so its
    # "recompute" is mostly a prefix hit.
    scheduler = make_scheduler(block_size=block_size, num_blocks=64)
    request = make_request("a", list(range(7)), max_tokens=10)
    scheduler.add_request(request)
    output = scheduler.schedule()
    scheduler.update_from_output(output, ModelRunnerOutput(["a"], [[99]]))
    scheduler.running.remove(request)
    scheduler.preemption.preempt(request, StepPlan(token_budget=0))
    assert request.num_computed_tokens == 0 and request.num_tokens == 8
    output = scheduler.schedule()
    (new,) = output.scheduled_new_reqs
    assert new.num_computed_tokens == (7 // block_size) * block_size
    assert output.num_scheduled_tokens == {"a": 8 - new.num_computed_tokens}
