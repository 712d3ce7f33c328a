"""Swap preemption, recompute fallback, the priority policy and aborts of swapped requests.

Exact block ids with tiny blocks: which request is the victim, which (device, host) block
pairs the worker must copy, and how a swapped-in request comes back.
"""

from __future__ import annotations

import logging

import pytest

from pagedllm.config import SchedulerConfig
from pagedllm.core.request_queue import PriorityRequestQueue, create_request_queue
from pagedllm.request import Request, RequestStatus
from tests.core.test_scheduler import TOKEN, make_request, make_scheduler, step


def prioritized(request_id: str, num_prompt_tokens: int, priority: int, **kwargs) -> Request:
    request = make_request(request_id, num_prompt_tokens, **kwargs)
    request.priority = priority
    return request


def test_swap_out_and_in_exact_blocks() -> None:
    scheduler = make_scheduler(
        block_size=2, num_blocks=5, max_model_len=8, preemption_mode="swap", num_cpu_blocks=4
    )
    a, b = make_request("a", 3, max_tokens=3), make_request("b", 3, max_tokens=5)
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler)  # a: [1, 2], b: [3, 4]
    step(scheduler)  # both decode within their blocks
    output, _ = step(scheduler)  # a needs a third block: b, the newest, is swapped out
    assert output.num_scheduled_tokens == {"a": 1}
    assert output.blocks_to_swap_out == [(3, 1), (4, 2)]  # (device, host), token order
    assert output.blocks_to_swap_in == []
    assert output.finished_request_ids == {"b"}
    assert b.status == RequestStatus.SWAPPED and b.num_computed_tokens == 4
    assert (scheduler.num_swapped, scheduler.num_waiting, scheduler.num_preemptions) == (1, 0, 1)
    assert scheduler.make_stats().num_swapped_reqs == 1
    output, _ = step(scheduler)  # a finished: b comes back without recompute
    (new,) = output.scheduled_new_reqs
    assert (new.request_id, new.block_ids, new.num_computed_tokens) == ("b", ([3, 4, 2],), 4)
    assert new.output_token_ids == [TOKEN, TOKEN]
    assert output.num_scheduled_tokens == {"b": 1}
    assert output.blocks_to_swap_in == [(3, 1), (4, 2)]
    assert scheduler.swap_manager.get_num_free_blocks() == 3
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert b.num_output_tokens == 5  # 3 + 5 = max_model_len 8
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 4


def test_swap_falls_back_to_recompute_without_host_space() -> None:
    # One usable host block (block 0 is unused) cannot hold b's two blocks.
    scheduler = make_scheduler(
        block_size=2, num_blocks=5, max_model_len=8, preemption_mode="swap", num_cpu_blocks=2
    )
    b = make_request("b", 3, max_tokens=5)
    scheduler.add_request(make_request("a", 3, max_tokens=3))
    scheduler.add_request(b)
    step(scheduler)
    step(scheduler)
    output, _ = step(scheduler)
    assert output.blocks_to_swap_out == []
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert list(scheduler.waiting) == [b]


def test_abort_swapped_request_frees_host_blocks() -> None:
    scheduler = make_scheduler(
        block_size=2, num_blocks=5, max_model_len=8, preemption_mode="swap", num_cpu_blocks=4
    )
    b = make_request("b", 3, max_tokens=5)
    scheduler.add_request(make_request("a", 3, max_tokens=3))
    scheduler.add_request(b)
    for _ in range(3):
        step(scheduler)
    assert b.status == RequestStatus.SWAPPED
    scheduler.abort_requests("b")
    assert b.status == RequestStatus.FINISHED_ABORTED
    assert scheduler.swap_manager.get_num_free_blocks() == 3 and scheduler.num_swapped == 0
    scheduler.check_integrity()
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 4


def test_swap_preemption_logs_mode_and_count() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("pagedllm.core.preemption")
    logger.addHandler(handler)
    try:
        test_swap_out_and_in_exact_blocks()
    finally:
        logger.removeHandler(handler)
    (record,) = records
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "preempted by swap mode" in message
    assert "total_num_cumulative_preemption=1" in message


def test_priority_queue_order() -> None:
    queue = create_request_queue("priority")
    assert isinstance(queue, PriorityRequestQueue)
    requests = [prioritized(name, 1, prio) for name, prio in [("x", 2), ("y", 0), ("z", 2)]]
    requests[0].arrival_time, requests[2].arrival_time = 2.0, 1.0
    for request in requests:
        queue.add(request)
    assert [r.request_id for r in queue] == ["y", "z", "x"]
    queue.remove(requests[1])
    assert queue.peek().request_id == "z"
    assert [queue.pop().request_id for _ in range(2)] == ["z", "x"]
    with pytest.raises(IndexError):
        queue.pop()


def test_priority_admits_lowest_value_first() -> None:
    scheduler = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    for name, priority in [("p2", 2), ("p0", 0), ("p1", 1)]:
        scheduler.add_request(prioritized(name, 2, priority, max_tokens=1))
    order = []
    while scheduler.has_unfinished_requests():
        output, _ = step(scheduler)
        order += [new.request_id for new in output.scheduled_new_reqs]
    assert order == ["p0", "p1", "p2"]


def test_priority_preempts_lower_priority_running_request() -> None:
    scheduler = make_scheduler(
        block_size=2, num_blocks=5, max_model_len=8, scheduling_policy="priority"
    )
    low = prioritized("low", 5, priority=5, max_tokens=4)
    scheduler.add_request(low)
    step(scheduler)  # low holds 3 of 4 blocks
    high = prioritized("high", 4, priority=0, max_tokens=4)
    scheduler.add_request(high)
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"high": 4}
    assert output.finished_request_ids == {"low"}
    assert low.status == RequestStatus.PREEMPTED
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert high.num_output_tokens == 4 and low.num_output_tokens == 3  # max_model_len


def test_fcfs_never_preempts_for_a_waiting_request() -> None:
    scheduler = make_scheduler(block_size=2, num_blocks=5, max_model_len=8)
    low = prioritized("low", 5, priority=5, max_tokens=4)
    scheduler.add_request(low)
    step(scheduler)
    scheduler.add_request(prioritized("high", 4, priority=0, max_tokens=4))
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"low": 1}
    assert scheduler.num_preemptions == 0


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "new"), ("priority", "old")])
def test_running_victim_follows_the_policy(policy: str, victim: str) -> None:
    scheduler = make_scheduler(
        block_size=2, num_blocks=5, max_model_len=8, scheduling_policy=policy
    )
    scheduler.add_request(prioritized("old", 3, priority=5))  # arrives first, low priority
    scheduler.add_request(prioritized("new", 3, priority=0))
    step(scheduler)
    step(scheduler)
    output, _ = step(scheduler)  # both need a third block; one is preempted
    assert output.finished_request_ids == {victim}
    assert scheduler.requests[victim].status == RequestStatus.PREEMPTED


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="preemption_mode"):
        SchedulerConfig(preemption_mode="drop")
    with pytest.raises(ValueError, match="scheduling_policy"):
        SchedulerConfig(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="scheduling_policy"):
        create_request_queue("lifo")
