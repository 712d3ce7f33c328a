"""The cap on prompt tokens a step computes beside decodes
(SchedulerConfig.prefill_tokens_per_decode): so many per decoding request, at least
MIN_PREFILL_CHUNK, so a new request's prefill is spread over steps while others decode and
their inter-token gaps stay short; steps without decodes, prompts that must run whole and
unchunked schedulers keep the full budget."""

from __future__ import annotations

import pytest

from pagedllm.config import MIN_PREFILL_CHUNK, CacheConfig, SchedulerConfig
from pagedllm.core.kv_cache_groups import KVCacheCapacity
from pagedllm.core.scheduler import Scheduler
from pagedllm.multimodal.inputs import MultiModalFeature
from pagedllm.request import Request, RequestData
from pagedllm.sampling_params import SamplingParams
from tests.core.test_scheduler import EOS, make_request, make_scheduler, step


def test_prefill_beside_one_decode_gets_the_smallest_chunk() -> None:
    assert MIN_PREFILL_CHUNK == 16
    scheduler = make_scheduler(max_num_batched_tokens=64, max_model_len=128,
                               prefill_tokens_per_decode=4)
    scheduler.add_request(make_request("a", 5, max_tokens=12))
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 5}
    scheduler.add_request(make_request("b", 30))
    scheduler.add_request(make_request("c", 6))
    # One decode: 4 tokens would be its share, the floor is 16; c waits for what is left.
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 1, "b": 16}
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 1, "b": 14, "c": 2}
    output, _ = step(scheduler)  # two decodes now: still the floor
    assert output.num_scheduled_tokens == {"a": 1, "b": 1, "c": 4}


def test_the_cap_grows_with_the_decodes() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=128, max_model_len=128,
                               prefill_tokens_per_decode=4)
    for i in range(6):
        scheduler.add_request(make_request(f"d{i}", 3, max_tokens=20))
    step(scheduler)  # six prompts at once: nothing decodes yet
    scheduler.add_request(make_request("p", 60))
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens["p"] == 24  # 6 decodes x 4
    assert output.total_num_scheduled_tokens == 30


def test_a_step_without_decodes_prefills_at_the_full_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64, prefill_tokens_per_decode=1)
    scheduler.add_request(make_request("a", 30))
    scheduler.add_request(make_request("b", 30))
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 30, "b": 30}


@pytest.mark.parametrize("options", [
    {},  # no cap: the token budget alone
    # An unchunked prompt must run whole: a cap would hold it back while decodes run.
    {"enable_chunked_prefill": False, "prefill_tokens_per_decode": 1},
], ids=["no cap", "unchunked"])
def test_a_prompt_beside_a_decode_runs_whole_without_a_cap(options: dict) -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64, **options)
    scheduler.add_request(make_request("a", 5))
    step(scheduler)
    scheduler.add_request(make_request("b", 40))
    output, _ = step(scheduler)
    assert output.num_scheduled_tokens == {"a": 1, "b": 40}


def test_a_preempted_request_recomputes_under_the_cap() -> None:
    # 7 usable blocks of 4 tokens: b's growth preempts the newest request, a, which then
    # recomputes its prompt and outputs (more than 16 tokens) as a prefill while b decodes.
    scheduler = make_scheduler(max_num_batched_tokens=64, block_size=4, num_blocks=8,
                               prefill_tokens_per_decode=1)
    scheduler.add_request(make_request("b", 4, max_tokens=24))
    scheduler.add_request(make_request("a", 17, max_tokens=12))
    while scheduler.num_preemptions == 0:
        step(scheduler)
    recomputed = []
    while scheduler.has_unfinished_requests():
        output, _ = step(scheduler)
        if "b" in output.num_scheduled_tokens and output.num_scheduled_tokens.get("a", 0) > 1:
            recomputed.append(output.num_scheduled_tokens["a"])
    assert recomputed == [MIN_PREFILL_CHUNK, MIN_PREFILL_CHUNK]


def test_a_pooling_input_beside_decodes_runs_whole_past_the_cap() -> None:
    from tests.core.test_scheduler_pooling import pooling_request, run_step

    scheduler = make_scheduler(max_num_batched_tokens=64, prefill_tokens_per_decode=1)
    scheduler.add_request(make_request("a", 5))
    run_step(scheduler)
    scheduler.add_request(pooling_request("p", 40))
    scheduled, finished = run_step(scheduler)
    assert scheduled == {"p": 40, "a": 1}
    assert [r.request_id for r in finished] == ["p"]


def test_a_negative_cap_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_decode"):
        SchedulerConfig(prefill_tokens_per_decode=-1)


def _scheduler_with_encoder() -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128,
                             max_num_encoder_input_tokens=64, encoder_cache_size=64,
                             prefill_tokens_per_decode=1)
    return Scheduler(config, CacheConfig(block_size=4, enable_prefix_caching=False),
                     KVCacheCapacity(64, 0, None))


def _image_request(request_id: str, offset: int) -> Request:
    # Gemma 3's kind: 40 image tokens that attend both ways, computed in one step.
    image = MultiModalFeature("image", f"img-{request_id}", offset, 40, bidirectional=True)
    data = RequestData([10 + i for i in range(80)], SamplingParams(max_tokens=4), EOS,
                       mm_features=[image])
    return Request(request_id, data)


@pytest.mark.parametrize("offset", [0, 4], ids=["admitted at the image", "running into it"])
def test_an_image_the_cap_cuts_off_passes_it_instead_of_waiting(offset: int) -> None:
    # The cap beside one decode is 16 tokens; the image is 40 and cannot be split.
    scheduler = _scheduler_with_encoder()
    scheduler.add_request(make_request("a", 5, max_tokens=30))
    step(scheduler)
    scheduler.add_request(_image_request("img", offset))
    for _ in range(4):
        output, _ = step(scheduler)
        assert "a" in output.num_scheduled_tokens  # a decodes all along
    assert scheduler.requests["img"].num_computed_tokens >= offset + 40


def test_pooling_inputs_leave_the_cap_to_the_prompts_it_caps() -> None:
    from tests.core.test_scheduler_pooling import pooling_request, run_step

    scheduler = make_scheduler(max_num_batched_tokens=64, max_model_len=128,
                               prefill_tokens_per_decode=1)
    scheduler.add_request(make_request("d", 5, max_tokens=40))
    run_step(scheduler)
    scheduler.add_request(make_request("r", 60))
    for i in range(3):  # a 20-token pooling input every step beside d and r's chunks
        scheduler.add_request(pooling_request(f"p{i}", 20))
        scheduled, _ = run_step(scheduler)
        assert scheduled[f"p{i}"] == 20 and scheduled["r"] == MIN_PREFILL_CHUNK
