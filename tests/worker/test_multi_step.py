"""Multi-step scheduling end to end (core/multi_step.py, worker/multi_step.py): the same
tokens as one step at a time, whatever the sampling, stops, prefix cache or preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedllm import LLM, SamplingParams

PROMPTS = [[5, 9, 30, 2, 77], [100, 3, 3, 41, 8, 19, 60], [7] * 20, [250, 17, 99]]


def generate(llm: LLM, params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def scheduler_of(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.scheduler


@pytest.fixture(scope="module")
def single(tiny_llama_dir: Path) -> LLM:
    # (one step at a time: the default groups the steps of requests answered whole)
    return LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, num_scheduler_steps=1)


@pytest.fixture(scope="module")
def multi(tiny_llama_dir: Path) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, num_scheduler_steps=4)


def test_greedy_equals_transformers(multi: LLM, tiny_llama_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from tests.conftest import hf_greedy_tokens

    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    # Lengths that are not multiples of the step count: the shortest one caps each step.
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
              for n in (13, 6, 9, 16)]
    got = generate(multi, params)
    want = hf_greedy_tokens(reference, PROMPTS, 16)
    assert got == [w[: p.max_tokens] for w, p in zip(want, params, strict=True)]


@pytest.mark.parametrize("kwargs", [
    {"temperature": 0.8, "top_p": 0.9, "seed": 11},
    {"temperature": 1.0, "top_k": 20, "seed": 3, "repetition_penalty": 1.3,
     "presence_penalty": 0.5, "frequency_penalty": 0.2},
    {"temperature": 0.7, "seed": 5, "stop": ["a", "e"]},
], ids=["seeded", "penalties", "stop-strings"])
def test_sampling_equals_one_step_at_a_time(single: LLM, multi: LLM, kwargs: dict) -> None:
    params = SamplingParams(**{"max_tokens": 14, **kwargs})
    assert generate(multi, params) == generate(single, params)


def test_stops_inside_a_group(single: LLM, multi: LLM) -> None:
    # Stop tokens the greedy continuations reach at their 3rd and 6th tokens (inside a
    # group of 4), and an EOS held back by min_tokens until then.
    free = generate(single, SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True))
    params = SamplingParams(temperature=0.0, max_tokens=14,
                            stop_token_ids=[free[0][2], free[1][5]])
    outputs = [multi.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                              use_tqdm=False),
               single.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                               use_tqdm=False)]
    got, want = ([(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in run]
                 for run in outputs)
    assert got == want
    assert got[0][1] == "stop" and len(got[0][0]) <= 3
    eos_params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6)
    assert generate(multi, eos_params) == generate(single, eos_params)


def test_mixed_batches_and_text(single: LLM, multi: LLM) -> None:
    # Requests with and without logprobs in one batch: those steps run one at a time.
    params = [SamplingParams(temperature=0.0, max_tokens=10, logprobs=2 if i == 1 else None)
              for i in range(len(PROMPTS))]
    got = multi.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    want = single.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].text == w.outputs[0].text
    assert len(got[1].outputs[0].logprobs) == 10


def test_prefix_cache_and_preemption(tiny_llama_dir: Path, single: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = generate(single, params)
    # 20 blocks of 4 tokens: four requests of up to 44 tokens cannot all fit, and the
    # lookahead slots of each multi-step make it tighter still.
    small = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64, block_size=4,
                num_gpu_blocks_override=20, num_scheduler_steps=4)
    assert generate(small, params) == want
    assert generate(small, params) == want  # the prompts' blocks from the cache
    scheduler = scheduler_of(small)
    assert scheduler.kv_cache_manager.prefix_cache_hits > 0
    assert scheduler.num_preemptions > 0
    assert scheduler.kv_cache_manager.usage == 0.0


def test_an_aborted_request_returns_its_blocks(multi: LLM) -> None:
    engine = multi.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine.add_request("long", {"prompt_token_ids": PROMPTS[0]}, params)
    for _ in range(3):
        engine.step()
    engine.abort_request("long")
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # the worker drops it
    assert scheduler_of(multi).kv_cache_manager.usage == 0.0


def test_steps_are_grouped(multi: LLM) -> None:
    engine = multi.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    engine.add_request("grouped", {"prompt_token_ids": PROMPTS[1]}, params)
    counts = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            counts.append(len(output.outputs[0].token_ids))
    assert counts == [1, 5, 9]  # the prefill's token, then 4 and 4


@pytest.mark.parametrize("kwargs, name", [
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                             "prompt_lookup_max": 3}}, "speculative_config"),
])
def test_conflicting_configs_are_refused(tiny_llama_dir: Path, kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        LLM(str(tiny_llama_dir), dtype="float32", num_scheduler_steps=2, **kwargs)


def test_a_request_failing_in_an_extra_step_keeps_the_tokens_before(
    tiny_llama_dir: Path, single: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fault injection (worker/fault_injection.py) makes a token embed to NaN: one the
    # first request generates as its 3rd token, so its 4th step (inside a group of 4) fails.
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    free = generate(single, params)
    used = {t for ids in PROMPTS for t in ids} | set(free[0][:2])
    marker = free[0][2]
    assert marker not in used and all(marker not in ids for ids in free[1:])
    monkeypatch.setenv("PAGEDLLM_INJECT_NONFINITE_TOKEN_ID", str(marker))
    results = []
    for steps in (1, 4):
        llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128,
                  num_scheduler_steps=steps)
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                               use_tqdm=False)
        results.append([(list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
                        for o in outputs])
        assert scheduler_of(llm).kv_cache_manager.usage == 0.0
    assert results[1] == results[0]
    assert results[0][0] == (free[0][:3], "error")
    assert [tokens for tokens, _ in results[0][1:]] == free[1:]
