"""KV cache events from the block pool (vLLM's BlockStored / BlockRemoved /
AllBlocksCleared): stored once per newly findable run of full blocks with its tokens and
parent, removed when a cached block's memory is reused, cleared on reset; encoded as vLLM's
msgspec arrays."""

from __future__ import annotations

import msgspec

from pagedllm.core.kv_cache_manager import KVCacheManager
from pagedllm.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from pagedllm.request import Request, RequestData
from pagedllm.sampling_params import SamplingParams

BLOCK = 4


def _request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, RequestData(tokens, SamplingParams(max_tokens=4)))


def _run(manager: KVCacheManager, request: Request) -> None:
    """Admit `request` with its cache hits and compute its whole prompt."""
    blocks, num_hit = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - num_hit, blocks) is not None
    request.num_computed_tokens = request.num_tokens


def test_stored_removed_and_cleared():
    manager = KVCacheManager(num_blocks=6, block_size=BLOCK)
    events = manager.enable_kv_events()
    first = _request("a", list(range(10)))  # 2 full blocks (+ 2 tokens)
    _run(manager, first)
    stored = events.take()
    assert stored == [BlockStored(block_hashes=first.block_hashes[:2], parent_block_hash=None,
                                  token_ids=list(range(8)), block_size=BLOCK, lora_id=None)]
    # Same first block, then its own: only the new block is stored, its parent the shared one.
    second = _request("b", [*range(4), 50, 51, 52, 53, 54])
    _run(manager, second)
    (event,) = events.take()
    assert event.block_hashes == [second.block_hashes[1]]
    assert event.parent_block_hash == first.block_hashes[0] == second.block_hashes[0]
    assert event.token_ids == [50, 51, 52, 53]
    manager.free(first)
    manager.free(second)
    assert events.take() == []  # freed blocks stay findable: nothing removed yet
    # A new request needs every block: the cached ones are reused, each removal reported.
    third = _request("c", list(range(100, 120)))
    _run(manager, third)
    removed = [e for e in events.take() if isinstance(e, BlockRemoved)]
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(
        {*first.block_hashes[:2], second.block_hashes[1]})
    manager.free(third)
    events.take()
    assert manager.reset_prefix_cache()
    assert events.take() == [AllBlocksCleared()]


def test_no_events_unless_enabled():
    manager = KVCacheManager(num_blocks=6, block_size=BLOCK)
    _run(manager, _request("a", list(range(10))))
    assert manager.block_pool.kv_events is None


def test_batches_encode_as_vllm_arrays():
    batch = KVEventBatch(ts=1.5, events=[
        BlockStored([b"h" * 32], None, [1, 2, 3, 4], 4, None),
        BlockRemoved([b"h" * 32]), AllBlocksCleared()], data_parallel_rank=0)
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(batch))
    assert raw[0] == 1.5 and raw[2] == 0
    assert raw[1][0][:5] == ["BlockStored", [b"h" * 32], None, [1, 2, 3, 4], 4]
    assert raw[1][1][0] == "BlockRemoved" and raw[1][2] == ["AllBlocksCleared"]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=KVEventBatch) == batch
