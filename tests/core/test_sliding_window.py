"""Sliding-window KV: groups of layers, blocks let go outside the window, prefix hits.

The issue's measure: a 32k-token sequence of a 4k-window model holds about 4k tokens of KV
in its sliding layers, while its global layers hold all 32k.
"""

from __future__ import annotations

from pagedllm.core.block_hash import hash_with_group_id
from pagedllm.core.kv_cache_groups import KVCacheGroupSpec, make_kv_cache_groups, num_kv_slots
from pagedllm.core.kv_cache_manager import KVCacheManager
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.core.scheduler import Scheduler
from pagedllm.request import Request, RequestData
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.outputs import ModelRunnerOutput
from tests.core.test_scheduler import make_scheduler

SLIDING, FULL = 0, 1
HYBRID = (KVCacheGroupSpec((0,), 4096), KVCacheGroupSpec((1,)))


def make_request(request_id: str, token_ids: list[int], max_tokens: int = 4) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(request_id, RequestData(token_ids, params))


def held(manager: KVCacheManager, request_id: str, group_id: int) -> int:
    """Real blocks (not null) of the request's table in one group."""
    return sum(1 for block_id in manager.get_block_ids(request_id)[group_id] if block_id)


# ------------------------------------------------------------------------------- groups


def test_gemma3_layers_make_six_groups_of_three() -> None:
    # Gemma 3 270M: 18 layers, every 6th global; window 512.
    windows = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
    groups = make_kv_cache_groups(windows, max_model_len=32768)
    assert [g.sliding_window for g in groups] == [512] * 5 + [None]
    assert groups[0].layer_indices == (0, 1, 2) and groups[-1].layer_indices == (5, 11, 17)
    assert num_kv_slots(groups) == 3
    assert sorted(i for g in groups for i in g.layer_indices) == list(range(18))


def test_window_not_shorter_than_the_context_is_full_attention() -> None:
    windows = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
    (group,) = make_kv_cache_groups(windows, max_model_len=512)
    assert group == KVCacheGroupSpec(tuple(range(18)), None)
    (group,) = make_kv_cache_groups([256] * 4, max_model_len=1024)  # Mistral: all sliding
    assert group == KVCacheGroupSpec((0, 1, 2, 3), 256)


def test_uneven_counts_leave_a_smaller_last_group() -> None:
    groups = make_kv_cache_groups([8, 8, 8, 8, 8, None, None], max_model_len=64)
    assert [g.layer_indices for g in groups] == [(0, 1), (2, 3), (4,), (5, 6)]
    assert num_kv_slots(groups) == 2


# ---------------------------------------------------------------------- block accounting


def test_32k_sequence_holds_a_window_of_blocks_in_sliding_layers() -> None:
    block_size, num_prompt = 16, 32768
    scheduler = make_scheduler(
        max_model_len=num_prompt + 8, max_num_batched_tokens=2048, block_size=block_size,
        num_blocks=4000, kv_cache_groups=HYBRID,
    )
    manager = scheduler.kv_cache_manager
    scheduler.add_request(make_request("a", [7] * num_prompt, max_tokens=4))
    peak_sliding = 0
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        peak_sliding = max(peak_sliding, held(manager, "a", SLIDING))
        scheduler.check_integrity()
        if output.num_scheduled_tokens["a"] == 1:  # decoding: past the whole prompt
            assert held(manager, "a", FULL) == -(-(num_prompt + 1) // block_size)
            # 4095 keys before the newest token + its block: 257 blocks of 16 tokens.
            assert 4096 // block_size <= held(manager, "a", SLIDING) <= 4096 // block_size + 1
            assert manager.get_num_free_blocks() == (
                manager.num_usable_blocks - held(manager, "a", FULL) - held(manager, "a", SLIDING)
            )
        runner_output = _sample_one_token(scheduler, output)
        scheduler.update_from_output(output, runner_output)
    # A chunk of 2048 tokens on top of the window, never the whole prompt.
    assert peak_sliding <= (4096 + 2048) // block_size + 1
    assert manager.get_num_free_blocks() == manager.num_usable_blocks


def test_every_layer_sliding_frees_behind_the_window() -> None:
    manager = KVCacheManager(64, block_size=4, groups=(KVCacheGroupSpec((0, 1), 8),))
    request = make_request("a", list(range(40)))
    assert manager.allocate_slots(request, 40) is not None
    request.num_computed_tokens = 40
    request.append_output_token_ids([99])
    assert manager.allocate_slots(request, 1) is not None
    # The token at position 40 sees positions 33..40: blocks 8, 9, 10 (of 4 tokens).
    (table,) = manager.get_block_ids("a")
    assert table[:8] == [0] * 8 and all(table[8:11])
    assert manager.get_num_free_blocks() == 63 - 3
    manager.check_integrity()
    manager.free(request)
    assert manager.get_num_free_blocks() == 63


# ------------------------------------------------------------------------ prefix caching

PROMPT = list(range(100, 140))  # 10 blocks of 4


def _cached_prompt(groups: tuple[KVCacheGroupSpec, ...]) -> tuple[KVCacheManager, Request]:
    """A manager whose cache holds PROMPT's 10 blocks, computed and freed by request "a"."""
    manager = KVCacheManager(64, block_size=4, groups=groups)
    first = make_request("a", PROMPT)
    assert manager.allocate_slots(first, 40) is not None
    first.num_computed_tokens = 40
    manager.free(first)
    return manager, first


def test_prefix_hit_needs_only_the_last_window_of_blocks() -> None:
    manager, _ = _cached_prompt((KVCacheGroupSpec((0,), 8), KVCacheGroupSpec((1,))))
    second = make_request("b", PROMPT + [1, 2])
    blocks, num_cached = manager.get_computed_blocks(second)
    assert num_cached == 40
    sliding, full = blocks
    # Position 40 sees 33..40: blocks 8 and 9 of the prompt must be there, 0..7 need not.
    assert [b.block_id for b in sliding[:8]] == [0] * 8 and all(b.block_id for b in sliding[8:])
    assert len(full) == 10 and all(b.block_id for b in full)
    assert manager.allocate_slots(second, 2, blocks) is not None
    assert held(manager, "b", SLIDING) == 2 + 1 and held(manager, "b", FULL) == 11
    manager.check_integrity()


def test_prefix_hit_survives_eviction_of_blocks_before_the_window() -> None:
    manager, first = _cached_prompt((KVCacheGroupSpec((0,), 8),))
    # Evict the cached copies of the first blocks (they are reused first, tail-freed last).
    pool = manager.block_pool
    for block_hash in first.block_hashes[:5]:
        block = pool.get_cached_block(block_hash)
        assert block is not None
        pool._evict(block)
    blocks, num_cached = manager.get_computed_blocks(make_request("b", PROMPT + [1]))
    assert num_cached == 40 and len(blocks[0]) == 10
    # With a block inside the window gone, the hit ends before it.
    pool._evict(pool.get_cached_block(first.block_hashes[8]))
    blocks, num_cached = manager.get_computed_blocks(make_request("c", PROMPT + [1]))
    assert num_cached == 8 * 4 and [b.block_id for b in blocks[0]][-2:] != [0, 0]


def test_hit_is_the_longest_length_every_group_serves() -> None:
    manager, first = _cached_prompt((KVCacheGroupSpec((0,), 8), KVCacheGroupSpec((1,))))
    pool = manager.block_pool
    # The full group lost block 6: the hit is 6 blocks, and the sliding group must then
    # have blocks 4 and 5 (it does), not 8 and 9.
    pool._evict(pool.get_cached_block(hash_with_group_id(first.block_hashes[6], FULL)))
    blocks, num_cached = manager.get_computed_blocks(make_request("b", PROMPT + [1]))
    assert num_cached == 24
    assert [len(group_blocks) for group_blocks in blocks] == [6, 6]
    assert all(b.block_id for b in blocks[0][4:6])


def _sample_one_token(scheduler: Scheduler, output: SchedulerOutput) -> ModelRunnerOutput:
    """A fake worker: token 5 for every request whose prompt is done."""
    request_ids = list(output.num_scheduled_tokens)
    sampled = []
    for request_id in request_ids:
        request = scheduler.requests[request_id]
        sampled.append([5] if request.num_computed_tokens == request.num_tokens else [])
    return ModelRunnerOutput(request_ids, sampled)
