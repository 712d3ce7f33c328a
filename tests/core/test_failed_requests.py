"""A request the runner reports as failed (non-finite forward) ends with finish_reason
"error" alone: its blocks return to the pool and leave the prefix cache, unless another
request shares them; the rest of the batch goes on."""

from __future__ import annotations

from pagedllm.request import FinishReason, Request, RequestData, RequestStatus
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.outputs import ModelRunnerOutput
from tests.core.test_scheduler import TOKEN, make_scheduler


def _request(request_id: str, prompt: list[int]) -> Request:
    return Request(request_id, RequestData(prompt, SamplingParams(max_tokens=4)))


def test_a_failed_request_ends_alone_and_its_own_blocks_leave_the_cache() -> None:
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=True)
    shared = list(range(100, 108))  # two full blocks both prompts start with
    scheduler.add_request(_request("bad", [*shared, 1, 2, 3, 4, 5]))
    scheduler.add_request(_request("good", [*shared, 6, 7, 8, 9, 10]))
    output = scheduler.schedule()
    runner_output = ModelRunnerOutput(
        ["bad", "good"], [[], [TOKEN]], failed_request_ids=["bad"]
    )
    pool = scheduler.kv_cache_manager.block_pool
    bad_blocks = scheduler.kv_cache_manager.get_block_ids("bad")[0]
    good_blocks = set(scheduler.kv_cache_manager.get_block_ids("good")[0])
    results = scheduler.update_from_output(output, runner_output)

    by_id = {request.request_id: (request, tokens) for request, tokens in results}
    bad, bad_tokens = by_id["bad"]
    assert bad.status == RequestStatus.FINISHED_ERROR and bad_tokens == []
    assert bad.get_finished_reason() == FinishReason.ERROR and str(FinishReason.ERROR) == "error"
    assert "bad" not in scheduler.requests and "bad" in scheduler.finished_request_ids
    good, good_tokens = by_id["good"]
    assert good.status == RequestStatus.RUNNING and good_tokens == [TOKEN]
    assert [r.request_id for r in scheduler.running] == ["good"]
    # Its own blocks are free and forgotten; the shared prefix (held by "good") stays cached.
    cached = {block.block_id for block in pool.cached_block_hash_to_block.values()}
    own = [b for b in bad_blocks if b not in good_blocks]
    assert own and not cached.intersection(own)
    assert good_blocks.intersection(bad_blocks) <= cached
    assert len(good_blocks.intersection(bad_blocks)) == 2
    scheduler.check_integrity()

    # "good" finishes normally; then every block is free.
    while scheduler.requests:
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        scheduler.update_from_output(output, ModelRunnerOutput(ids, [[TOKEN] for _ in ids]))
    manager = scheduler.kv_cache_manager
    assert manager.get_num_free_blocks() == manager.num_usable_blocks
