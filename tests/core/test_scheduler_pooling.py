"""Pooling requests in the scheduler: computed whole in one step, first in line, beside the
generating batch (never more than a step behind it), packed under the token budget, no KV
blocks on an encoder, every block returned when they finish or are aborted."""

from __future__ import annotations

import pytest

from pagedllm.core.scheduler import Scheduler
from pagedllm.pooling.data import PooledData
from pagedllm.pooling_params import PoolingParams
from pagedllm.request import Request, RequestData, RequestStatus
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.outputs import ModelRunnerOutput

from .test_scheduler import TOKEN, make_request, make_scheduler


def pooling_request(request_id: str, num_tokens: int) -> Request:
    return Request(request_id, RequestData(
        [10 + i for i in range(num_tokens)], SamplingParams(max_tokens=1),
        pooling_params=PoolingParams(task="embed"),
    ))  # fmt: skip


def run_step(scheduler: Scheduler) -> tuple[dict[str, int], list[Request]]:
    """One step with a fake worker: a token for every sampling request, a pooled output
    for every pooling one. Returns the scheduled token counts and the finished requests."""
    output = scheduler.schedule()
    ids = list(output.num_scheduled_tokens)
    requests = {rid: scheduler.requests[rid] for rid in ids}
    sampled = [
        [TOKEN] if not r.is_pooling and r.num_computed_tokens >= r.num_tokens else []
        for r in requests.values()
    ]
    pooled = {rid: PooledData([1], b"\0" * 4) for rid, r in requests.items() if r.is_pooling}
    runner_output = ModelRunnerOutput(ids, sampled, pooler_output=pooled)
    results = scheduler.update_from_output(output, runner_output)
    scheduler.check_integrity()
    return dict(output.num_scheduled_tokens), [r for r, _ in results if r.is_finished()]


def test_short_inputs_are_packed_into_one_step_and_finish_with_it() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=2)
    for i, n in enumerate([5, 17, 3, 30]):  # 55 tokens: more requests than seats
        scheduler.add_request(pooling_request(f"p{i}", n))
    scheduled, finished = run_step(scheduler)
    assert scheduled == {"p0": 5, "p1": 17, "p2": 3, "p3": 30}  # whole, never chunked
    assert {r.request_id for r in finished} == set(scheduled)
    assert all(r.status == RequestStatus.FINISHED_STOPPED for r in finished)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 63  # all returned


def test_inputs_past_the_budget_wait_for_the_next_step_in_order() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=32)
    for i, n in enumerate([20, 20, 5]):
        scheduler.add_request(pooling_request(f"p{i}", n))
    assert run_step(scheduler)[0] == {"p0": 20}  # p2 would fit but does not jump p1
    assert run_step(scheduler)[0] == {"p1": 20, "p2": 5}


def test_a_pooling_request_runs_beside_a_full_generating_batch_within_one_step() -> None:
    """Seats full of long generations and a long prefill in flight: the embedding request
    still runs in the very next step, and every running decode keeps its token."""
    scheduler = make_scheduler(max_num_batched_tokens=32, max_num_seqs=3, max_model_len=200,
                               num_blocks=200)  # fmt: skip
    for i in range(2):
        scheduler.add_request(make_request(f"g{i}", 4, max_tokens=100))
    scheduler.add_request(make_request("long", 120, max_tokens=10))
    for _ in range(3):
        run_step(scheduler)
    assert scheduler.num_running == 3  # every seat taken, "long" still prefilling
    scheduler.add_request(pooling_request("embed", 25))
    scheduled, finished = run_step(scheduler)
    assert scheduled["embed"] == 25 and [r.request_id for r in finished] == ["embed"]
    assert scheduled["g0"] == scheduled["g1"] == 1  # the decodes kept their token
    assert sum(scheduled.values()) <= 32


def test_no_kv_cache_means_no_blocks() -> None:
    scheduler = make_scheduler(kv_cache_groups=())
    scheduler.add_request(pooling_request("p", 40))
    output = scheduler.schedule()
    assert output.scheduled_new_reqs[0].block_ids == ()
    assert output.scheduled_new_reqs[0].data.pooling_params == PoolingParams(task="embed")


def test_abort_returns_every_block_waiting_or_in_flight() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=32)
    scheduler.add_request(pooling_request("in_flight", 30))
    scheduler.add_request(pooling_request("waiting", 30))
    scheduler.schedule()
    scheduler.abort_requests(["in_flight", "waiting"])
    scheduler.check_integrity()
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 63


def test_an_input_longer_than_the_budget_is_refused() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="max_num_batched_tokens=16"):
        scheduler.add_request(pooling_request("p", 17))
