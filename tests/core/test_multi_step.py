"""Multi-step scheduling in the scheduler (core/multi_step.py): when a step runs several
decode steps, the lookahead slots its requests get, and how the returned tokens are taken
(computed positions, stop checks, max_tokens)."""

from __future__ import annotations

import pytest

from pagedllm.config import (
    CacheConfig,
    DeviceConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from pagedllm.core.multi_step import AUTO_SCHEDULER_STEPS
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.request import RequestStatus
from pagedllm.sampling_params import RequestOutputKind
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.worker.outputs import ModelRunnerOutput
from tests.core.test_scheduler import EOS, TOKEN, make_request, make_scheduler, step


def run_steps(scheduler, output: SchedulerOutput, tokens: dict[str, list[int]] | None = None):
    """The runner's answer to a (multi-)step: `num_steps` tokens each (TOKEN by default)."""
    tokens = tokens or {}
    request_ids = list(output.num_scheduled_tokens)
    sampled = [tokens.get(rid, [TOKEN] * output.num_steps) for rid in request_ids]
    results = scheduler.update_from_output(output, ModelRunnerOutput(request_ids, sampled))
    scheduler.check_integrity()
    return results


def test_decodes_get_several_steps_and_their_slots() -> None:
    scheduler = make_scheduler(block_size=4, num_blocks=16, num_scheduler_steps=4)
    a = make_request("a", 6, max_tokens=20)
    scheduler.add_request(a)
    output, _ = step(scheduler)  # the prompt: one step
    assert output.num_steps == 1 and a.num_computed_tokens == 6
    output = scheduler.schedule()
    assert output.num_steps == 4 and output.num_scheduled_tokens == {"a": 1}
    # Positions 6..9 are written: blocks 1, 2 (prompt) and a third for 8 and 9.
    assert scheduler.kv_cache_manager.get_block_ids("a")[0] == [1, 2, 3]
    results = run_steps(scheduler, output)
    assert results == [(a, [TOKEN] * 4)]
    assert a.num_computed_tokens == 10 and a.num_tokens == 11  # 6 prompt + 5 out


def test_steps_end_at_the_shortest_max_tokens() -> None:
    scheduler = make_scheduler(num_scheduler_steps=8)
    a, b = make_request("a", 3, max_tokens=4), make_request("b", 3, max_tokens=30)
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler)
    output = scheduler.schedule()
    assert output.num_steps == 3  # a has 3 tokens left after its first
    run_steps(scheduler, output)
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED and a.num_output_tokens == 4
    assert scheduler.schedule().num_steps == 8  # b alone


def test_a_stop_token_cuts_the_returned_tokens() -> None:
    scheduler = make_scheduler(num_scheduler_steps=4)
    a = make_request("a", 3, max_tokens=20)
    scheduler.add_request(a)
    step(scheduler)
    output = scheduler.schedule()
    results = run_steps(scheduler, output, {"a": [TOKEN, EOS, TOKEN, TOKEN]})
    assert results == [(a, [TOKEN, EOS])]
    assert a.status == RequestStatus.FINISHED_STOPPED
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 63  # all back (block 0 null)


def test_a_waiting_request_with_a_seat_makes_it_one_step() -> None:
    scheduler = make_scheduler(num_scheduler_steps=4, max_num_seqs=2)
    scheduler.add_request(make_request("a", 3))
    step(scheduler)
    scheduler.add_request(make_request("b", 3))
    output = scheduler.schedule()
    assert output.num_steps == 1 and set(output.num_scheduled_tokens) == {"a", "b"}
    run_steps(scheduler, output)
    scheduler.add_request(make_request("c", 3))  # no seat: a and b go on several steps
    assert scheduler.schedule().num_steps == 4


@pytest.mark.parametrize("params", [{"logprobs": 2}, {"n": 1, "logprobs": 0}])
def test_a_request_with_logprobs_runs_one_step(params: dict) -> None:
    scheduler = make_scheduler(num_scheduler_steps=4)
    scheduler.add_request(make_request("a", 3))
    scheduler.add_request(make_request("b", 3, **params))
    step(scheduler)
    assert scheduler.schedule().num_steps == 1


def test_steps_stop_at_max_model_len() -> None:
    scheduler = make_scheduler(num_scheduler_steps=8, max_model_len=12)
    a = make_request("a", 6, max_tokens=6)
    scheduler.add_request(a)
    step(scheduler)  # 7 tokens
    output = scheduler.schedule()
    assert output.num_steps == 5  # positions 6..10 computed, 12 tokens in the end
    run_steps(scheduler, output)
    assert a.num_tokens == 12 and a.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_a_group_that_would_preempt_runs_as_one_step() -> None:
    # 5 usable blocks of 2: two requests of 3 tokens hold 2 blocks each; 4 steps each
    # would need 2 more blocks each, and 1 is free. A group's lookahead slots never
    # preempt (one step at a time would preempt no one here): the step is a single one.
    scheduler = make_scheduler(block_size=2, num_blocks=6, num_scheduler_steps=4)
    a, b = make_request("a", 3, max_tokens=6), make_request("b", 3, max_tokens=6)
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler)
    output = scheduler.schedule()
    assert output.num_steps == 1 and output.num_scheduled_tokens == {"a": 1, "b": 1}
    assert b.status == RequestStatus.RUNNING
    run_steps(scheduler, output)


def test_num_scheduler_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        SchedulerConfig(num_scheduler_steps=0)


def test_lookahead_left_unused_is_freed_before_a_swap() -> None:
    # A higher-priority arrival preempts for a seat: that step is one step, and the
    # lookahead slots its requests were given must not stay allocated (a swap-out asserts
    # that a preempted request holds no unused blocks).
    scheduler = make_scheduler(block_size=4, num_cpu_blocks=32, max_num_seqs=2,
                               preemption_mode="swap", scheduling_policy="priority",
                               num_scheduler_steps=4)
    for request_id in ("a", "b"):
        request = make_request(request_id, 3)
        request.priority = 5
        scheduler.add_request(request)
    step(scheduler)
    c = make_request("c", 3)
    c.priority = 0
    scheduler.add_request(c)
    output = scheduler.schedule()
    assert output.num_steps == 1 and "c" in output.num_scheduled_tokens
    run_steps(scheduler, output)
    d = make_request("d", 3)
    d.priority = 0
    scheduler.add_request(d)
    output = scheduler.schedule()  # swaps out a running request for d
    scheduler.check_integrity()
    assert "d" in output.num_scheduled_tokens and output.blocks_to_swap_out


def test_an_empty_step_is_never_a_multi_step() -> None:
    scheduler = make_scheduler(num_scheduler_steps=4)
    assert scheduler.schedule().num_steps == 1


def test_the_default_groups_only_requests_whose_output_is_final() -> None:
    """num_scheduler_steps=None: AUTO_SCHEDULER_STEPS while every running request takes
    its final output alone (the offline LLM's); one step while one streams."""
    scheduler = make_scheduler(num_blocks=64, num_scheduler_steps=None)
    final = make_request("final", 3, max_tokens=30, output_kind=RequestOutputKind.FINAL_ONLY)
    scheduler.add_request(final)
    step(scheduler)
    output = scheduler.schedule()
    assert output.num_steps == AUTO_SCHEDULER_STEPS
    run_steps(scheduler, output)
    streamed = make_request("streamed", 3, max_tokens=30)  # CUMULATIVE, vLLM's default
    scheduler.add_request(streamed)
    step(scheduler)  # streamed's prompt
    assert scheduler.schedule().num_steps == 1


def test_the_default_stands_aside_for_a_system_between_steps() -> None:
    """The automatic default becomes 1 where multi-step cannot run; an explicit count
    there is an error."""
    spec = SpeculativeConfig("ngram", num_speculative_tokens=2, prompt_lookup_max=3)
    model = ModelConfig("m", "m", None, "float32", 64, 0, "LlamaForCausalLM", None)

    def config(steps: int | None) -> EngineConfig:
        return EngineConfig(model, CacheConfig(), SchedulerConfig(num_scheduler_steps=steps),
                            DeviceConfig(), speculative_config=spec)

    assert config(None).scheduler_config.num_scheduler_steps == 1
    assert config(1).scheduler_config.num_scheduler_steps == 1
    with pytest.raises(ValueError, match="speculative_config"):
        config(4)

