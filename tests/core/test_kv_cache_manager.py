"""KVCacheManager: block counts per token, exact block ids, reverse freeing, integrity."""

from __future__ import annotations

import pytest

from pagedllm.core.kv_cache_manager import KVCacheManager
from pagedllm.request import Request, RequestData
from pagedllm.sampling_params import SamplingParams


def make_request(request_id: str, num_prompt_tokens: int) -> Request:
    data = RequestData(list(range(num_prompt_tokens)), SamplingParams(max_tokens=8))
    return Request(request_id, data)


def free_ids(manager: KVCacheManager) -> list[int]:
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


def test_allocate_grows_by_whole_blocks() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=4)
    request = make_request("a", 10)
    assert manager.allocate_slots(request, 10) == ([1, 2, 3],)
    request.num_computed_tokens = 10
    assert manager.allocate_slots(request, 1) == ([],)  # 11 tokens still fit 3 blocks
    request.num_computed_tokens = 11
    assert manager.allocate_slots(request, 2) == ([4],)  # 13 tokens need 4 blocks
    assert manager.get_block_ids("a") == ([1, 2, 3, 4],)
    assert manager.get_num_free_blocks() == 1
    assert manager.usage == pytest.approx(0.8)
    manager.check_integrity()


def test_allocate_returns_none_and_changes_nothing() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=2)
    a, b = make_request("a", 4), make_request("b", 3)
    assert manager.allocate_slots(a, 4) == ([1, 2],)
    assert manager.allocate_slots(b, 3) is None
    assert manager.get_block_ids("b") == ([],)
    assert manager.get_num_free_blocks() == 1
    assert manager.allocate_slots(b, 2) == ([3],)
    manager.check_integrity()


def test_free_returns_blocks_tail_first() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=1)
    a, b = make_request("a", 3), make_request("b", 1)
    assert manager.allocate_slots(a, 3) == ([1, 2, 3],)
    assert manager.allocate_slots(b, 1) == ([4],)
    manager.free(a)
    # Queue was [5]; a's tail block is freed first, so it is reused first.
    assert free_ids(manager) == [5, 3, 2, 1]
    assert manager.get_block_ids("a") == ([],)
    c = make_request("c", 3)
    assert manager.allocate_slots(c, 3) == ([5, 3, 2],)
    manager.free(a)  # a second free is a no-op
    manager.check_integrity()


def test_free_all_restores_pool() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=2)
    requests = [make_request(str(i), i + 1) for i in range(4)]
    for request in requests:
        assert manager.allocate_slots(request, request.num_prompt_tokens) is not None
    assert manager.get_request_ids() == {"0", "1", "2", "3"}
    for request in requests:
        manager.free(request)
    assert manager.get_num_free_blocks() == manager.num_usable_blocks == 7
    assert manager.get_request_ids() == set()
    manager.check_integrity()


def test_integrity_catches_wrong_ref_count() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=2)
    request = make_request("a", 3)
    manager.allocate_slots(request, 3)
    manager.block_pool.blocks[1].ref_cnt = 2
    with pytest.raises(AssertionError, match="holders"):
        manager.check_integrity()


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=4, block_size=0)
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=1, block_size=4)
    manager = KVCacheManager(num_blocks=4, block_size=2)
    with pytest.raises(ValueError):
        manager.allocate_slots(make_request("a", 1), -1)
