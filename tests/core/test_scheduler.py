"""Scheduler: budget, chunking, sequence cap, preemption, aborts, stop checks, invariants.

Unit tests pin exact block ids with tiny blocks (prefix caching off, so identical prompts
do not share blocks); test_scheduler_random.py drives random workloads through a fake
worker and checks every invariant after every step.
"""

from __future__ import annotations

import logging

import pytest

from pagedllm.config import CacheConfig, SchedulerConfig
from pagedllm.core.kv_cache_groups import KVCacheCapacity, KVCacheGroupSpec
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.core.scheduler import Scheduler
from pagedllm.request import FinishReason, Request, RequestData, RequestStatus
from pagedllm.sampling_params import SamplingParams
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.worker.outputs import ModelRunnerOutput

EOS = 2
TOKEN = 7  # a token that stops nothing


def make_scheduler(
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    block_size: int = 4,
    num_blocks: int = 64,
    enable_chunked_prefill: bool = True,
    enable_prefix_caching: bool = False,
    preemption_mode: str = "recompute",
    scheduling_policy: str = "fcfs",
    num_cpu_blocks: int = 0,
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] | None = None,
    num_lookahead_slots: int = 0,
    prefill_tokens_per_decode: int = 0,
    num_scheduler_steps: int | None = 1,
) -> Scheduler:
    """A scheduler with tiny limits; prefix caching is off unless asked for, so that the
    identical prompts of these tests do not share blocks."""
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
        preemption_mode=preemption_mode,
        scheduling_policy=scheduling_policy,
        prefill_tokens_per_decode=prefill_tokens_per_decode,
        num_scheduler_steps=num_scheduler_steps,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    speculative_config = None
    if num_lookahead_slots:  # a drafter with a KV cache of its own takes k lookahead slots
        speculative_config = SpeculativeConfig(
            "eagle", num_speculative_tokens=num_lookahead_slots, model="a head"
        )
    return Scheduler(
        scheduler_config, cache_config,
        KVCacheCapacity(num_blocks, num_cpu_blocks, kv_cache_groups),
        speculative_config=speculative_config,
    )


def make_request(
    request_id: str, num_prompt_tokens: int, max_tokens: int = 16, **params: object
) -> Request:
    prompt = [10 + i for i in range(num_prompt_tokens)]
    sampling_params = SamplingParams(max_tokens=max_tokens, **params)  # type: ignore[arg-type]
    return Request(request_id, RequestData(prompt, sampling_params, EOS))


def model_output(
    scheduler: Scheduler, output: SchedulerOutput, tokens: dict[str, int] | None = None
) -> ModelRunnerOutput:
    """Sample `tokens[id]` (default TOKEN) for each request whose prompt is fully computed."""
    tokens = tokens or {}
    request_ids = list(output.num_scheduled_tokens)
    sampled = []
    for request_id in request_ids:
        request = scheduler.requests[request_id]
        is_done = request.num_computed_tokens == request.num_tokens
        sampled.append([tokens.get(request_id, TOKEN)] if is_done else [])
    return ModelRunnerOutput(request_ids, sampled)


def step(
    scheduler: Scheduler, tokens: dict[str, int] | None = None
) -> tuple[SchedulerOutput, list[tuple[Request, list[int]]]]:
    output = scheduler.schedule()
    scheduler.check_integrity()
    results = scheduler.update_from_output(output, model_output(scheduler, output, tokens))
    scheduler.check_integrity()
    return output, results


def new_ids(output: SchedulerOutput) -> list[str]:
    return [new.request_id for new in output.scheduled_new_reqs]


def test_prefill_then_decode_exact_blocks() -> None:
    scheduler = make_scheduler(block_size=4, num_blocks=8)
    scheduler.add_request(make_request("a", 6, max_tokens=4))
    output, results = step(scheduler, {"a": 100})
    (new,) = output.scheduled_new_reqs
    assert (new.request_id, new.block_ids, new.num_computed_tokens) == ("a", ([1, 2],), 0)
    assert new.data.prompt_token_ids == list(range(10, 16)) and new.output_token_ids == []
    assert new.data.eos_token_id == EOS
    assert output.num_scheduled_tokens == {"a": 6} and output.total_num_scheduled_tokens == 6
    assert [(r.request_id, t) for r, t in results] == [("a", [100])]
    output, _ = step(scheduler)  # position 6: still in block 2
    cached = output.scheduled_cached_reqs
    assert output.scheduled_new_reqs == []
    assert (cached.request_ids, cached.new_block_ids, cached.num_computed_tokens) == (
        ["a"],
        [([],)],
        [6],
    )
    output, _ = step(scheduler)  # position 7
    assert output.scheduled_cached_reqs.new_block_ids == [([],)]
    output, results = step(scheduler)  # position 8 opens block 3
    assert output.scheduled_cached_reqs.new_block_ids == [([3],)]
    request = results[0][0]
    assert request.output_token_ids == [100, TOKEN, TOKEN, TOKEN]
    assert request.get_finished_reason() == FinishReason.LENGTH
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 7
    assert scheduler.schedule().finished_request_ids == {"a"}
    assert scheduler.schedule().finished_request_ids == set()


def test_budget_chunks_prompts_and_mixes_decode() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    for request_id in "abc":
        scheduler.add_request(make_request(request_id, 5))
    output, results = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 5, "b": 3}
    assert [r.request_id for r, _ in results] == ["a"]  # b is only partly prefilled
    output, results = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 1, "b": 2, "c": 5}
    assert output.scheduled_cached_reqs.num_computed_tokens == [5, 3]
    assert new_ids(output) == ["c"]
    assert sorted(r.request_id for r, _ in results) == ["a", "b", "c"]


def test_chunked_prefill_disabled_keeps_fcfs() -> None:
    scheduler = make_scheduler(
        max_num_batched_tokens=8, max_model_len=8, enable_chunked_prefill=False
    )
    scheduler.add_request(make_request("a", 5))
    scheduler.add_request(make_request("b", 5))
    scheduler.add_request(make_request("c", 2))  # would fit, but may not jump ahead of b
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 5}
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 1, "b": 5, "c": 2}


def test_sequence_cap() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    scheduler.add_request(make_request("a", 3, max_tokens=1))
    scheduler.add_request(make_request("b", 3, max_tokens=5))
    scheduler.add_request(make_request("c", 3))
    output, _ = step(scheduler)
    assert list(output.num_scheduled_tokens) == ["a", "b"]
    assert scheduler.num_running == 1 and scheduler.num_waiting == 1  # a finished
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"b": 1, "c": 3}
    assert output.finished_request_ids == {"a"}


def test_max_model_len_prompt_gets_one_token() -> None:
    scheduler = make_scheduler(max_model_len=8, block_size=4, num_blocks=3)
    scheduler.add_request(make_request("a", 8, max_tokens=10))
    output, results = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 8}
    request, token_ids = results[0]
    assert token_ids == [TOKEN] and request.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_preempts_latest_and_resumes_as_new_request() -> None:
    scheduler = make_scheduler(block_size=2, num_blocks=5, max_model_len=8)
    a = make_request("a", 3, max_tokens=3)
    b = make_request("b", 3, max_tokens=5)
    scheduler.add_request(a)
    scheduler.add_request(b)
    output, _ = step(scheduler)
    assert [n.block_ids for n in output.scheduled_new_reqs] == [([1, 2],), ([3, 4],)]
    step(scheduler)  # both decode within their blocks
    output, _ = step(scheduler)  # a needs a third block: b, the newest, is preempted
    assert output.num_scheduled_tokens == {"a": 1}
    assert output.scheduled_cached_reqs.new_block_ids == [([4],)]
    assert output.finished_request_ids == {"b"}
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert (b.num_preemptions, scheduler.num_preemptions) == (1, 1)
    assert list(scheduler.waiting) == [b]
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED
    output, _ = step(scheduler)  # b resumes with prompt + outputs recomputed
    (new,) = output.scheduled_new_reqs
    assert new.request_id == "b" and new.output_token_ids == [TOKEN, TOKEN]
    assert new.num_computed_tokens == 0 and output.num_scheduled_tokens == {"b": 5}
    # Freed tail first: b's [4, 3], then a's [4, 2, 1] after taking 4.
    assert new.block_ids == ([3, 4, 2],)
    assert output.finished_request_ids == {"a"}
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert b.num_output_tokens == 5
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 4


def test_request_preempts_itself_when_it_is_the_newest() -> None:
    scheduler = make_scheduler(block_size=2, num_blocks=5, max_model_len=8)
    a = make_request("a", 3, max_tokens=2)
    b = make_request("b", 4, max_tokens=2)
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler)
    output, _ = step(scheduler)  # a fits in its blocks; b needs a third one
    assert output.num_scheduled_tokens == {"a": 1}
    assert output.finished_request_ids == {"b"}
    assert b.status == RequestStatus.PREEMPTED
    assert scheduler.kv_cache_manager.get_block_ids("b") == ([],)
    output, _ = step(scheduler)
    assert new_ids(output) == ["b"] and output.num_scheduled_tokens == {"b": 5}
    step(scheduler)
    assert not scheduler.has_unfinished_requests()
    assert b.output_token_ids == [TOKEN, TOKEN]


def test_preemption_logs_a_warning() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("pagedllm.core.preemption")
    logger.addHandler(handler)
    try:
        test_request_preempts_itself_when_it_is_the_newest()
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert record.levelno == logging.WARNING
    assert "is preempted" in record.getMessage()
    assert "total_num_cumulative_preemption=1" in record.getMessage()


def test_abort_waiting_running_and_preempted() -> None:
    scheduler = make_scheduler(block_size=2, num_blocks=5, max_model_len=8)
    a, b, c = make_request("a", 3), make_request("b", 4), make_request("c", 2)
    for request in (a, b, c):
        scheduler.add_request(request)
    step(scheduler)  # a, b run; c waits (no blocks)
    step(scheduler)  # b preempts itself
    assert (a.status, b.status, c.status) == (
        RequestStatus.RUNNING,
        RequestStatus.PREEMPTED,
        RequestStatus.WAITING,
    )
    scheduler.abort_requests(["c", "b", "unknown"])
    scheduler.abort_requests("a")
    scheduler.abort_requests(["a"])  # already finished: ignored
    for request in (a, b, c):
        assert request.status == RequestStatus.FINISHED_ABORTED
        assert request.get_finished_reason() == FinishReason.ABORT
    assert scheduler.num_running == scheduler.num_waiting == 0
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 4
    scheduler.check_integrity()
    output = scheduler.schedule()
    assert output.is_empty and output.finished_request_ids == {"a", "b", "c"}


def test_abort_between_schedule_and_update() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 3))
    scheduler.add_request(make_request("b", 3))
    output = scheduler.schedule()
    runner_output = model_output(scheduler, output)
    scheduler.abort_requests(["a"])
    results = scheduler.update_from_output(output, runner_output)
    assert [r.request_id for r, _ in results] == ["b"]
    scheduler.check_integrity()
    assert scheduler.schedule().finished_request_ids == {"a"}


def test_finish_requests_needs_finished_status() -> None:
    scheduler = make_scheduler()
    with pytest.raises(ValueError):
        scheduler.finish_requests(["a"], RequestStatus.RUNNING)


def run_to_end(scheduler: Scheduler, request: Request, tokens: list[int]) -> list[int]:
    """Feed `tokens` one per step to a lone request; return all tokens it accepted."""
    scheduler.add_request(request)
    accepted: list[int] = []
    for token_id in tokens:
        _, results = step(scheduler, {request.request_id: token_id})
        accepted += [t for _, new in results for t in new]
        if request.is_finished():
            break
    return accepted


def test_eos_stops() -> None:
    request = make_request("a", 2)
    assert run_to_end(make_scheduler(), request, [5, EOS, 6]) == [5, EOS]
    assert request.status == RequestStatus.FINISHED_STOPPED and request.stop_reason is None


def test_stop_token_id_sets_stop_reason() -> None:
    request = make_request("a", 2, stop_token_ids=[9])
    assert run_to_end(make_scheduler(), request, [5, 9, 6]) == [5, 9]
    assert request.get_finished_reason() == FinishReason.STOP and request.stop_reason == 9


def test_min_tokens_delays_eos_and_stop_ids() -> None:
    request = make_request("a", 2, min_tokens=3, stop_token_ids=[9])
    assert run_to_end(make_scheduler(), request, [EOS, 9, EOS, 6]) == [EOS, 9, EOS]
    assert request.status == RequestStatus.FINISHED_STOPPED and request.stop_reason is None


def test_ignore_eos_runs_to_max_tokens() -> None:
    request = make_request("a", 2, max_tokens=3, ignore_eos=True)
    assert run_to_end(make_scheduler(), request, [EOS] * 5) == [EOS] * 3
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_max_model_len_caps_output() -> None:
    request = make_request("a", 6, max_tokens=100)
    scheduler = make_scheduler(max_model_len=8)
    assert run_to_end(scheduler, request, [5] * 5) == [5, 5]
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED and request.num_tokens == 8


def test_add_request_validation() -> None:
    scheduler = make_scheduler(max_model_len=8, block_size=2, num_blocks=5)
    scheduler.add_request(make_request("a", 3))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(make_request("a", 3))
    with pytest.raises(ValueError, match="empty prompt"):
        scheduler.add_request(make_request("b", 0))
    with pytest.raises(ValueError, match="max_model_len"):
        scheduler.add_request(make_request("c", 9))
    small = make_scheduler(max_model_len=64, block_size=2, num_blocks=3)
    small.add_request(make_request("d", 2, max_tokens=3))  # 4 tokens of KV at most
    with pytest.raises(ValueError, match="KV blocks"):
        small.add_request(make_request("e", 2, max_tokens=4))
