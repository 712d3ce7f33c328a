"""A request whose forward produces non-finite logits fails alone (finish_reason "error"),
whatever its neighbours do: greedy, seeded sampling, speculative verification. The fault is
injected with PAGEDLLM_INJECT_NONFINITE_TOKEN_ID (worker/fault_injection.py): positions with
that token embed to NaN, which reaches the request's KV cache and logits."""

from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams
from tests.conftest import hf_greedy_tokens
from tests.entrypoints.test_prefix_and_preemption import _all_blocks_free

MAX_TOKENS = 8
GOOD = [list(range(5, 25)), [40, 41, 42, 43, 44, 45, 46]]  # the first: a full block and more
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def greedy_reference(model_dir) -> list[list[int]]:
    """transformers' greedy continuations of GOOD."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return hf_greedy_tokens(model, GOOD, MAX_TOKENS)


def pick_marker(reference: list[list[int]]) -> int:
    """A token id neither the good prompts nor their outputs contain."""
    used = {t for ids in GOOD + reference for t in ids}
    return next(t for t in range(20, 1000) if t not in used)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir) -> list[list[int]]:
    return greedy_reference(tiny_llama_dir)


@pytest.fixture(scope="module")
def marker(reference) -> int:
    return pick_marker(reference)


@pytest.fixture
def llm(tiny_llama_dir, marker, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_INJECT_NONFINITE_TOKEN_ID", str(marker))
    return LLM(str(tiny_llama_dir), dtype="float32", num_gpu_blocks_override=128,
               enable_prefix_caching=True)


def bad_prompt(marker: int) -> list[int]:
    # Shares GOOD[0]'s first block, then the fault: the shared block must stay usable.
    return [*GOOD[0][:16], marker, 60, 61]


def _generate(llm: LLM, prompts: list[list[int]], params: SamplingParams):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def test_greedy_neighbours_are_untouched(llm, marker, reference):
    prompts = [GOOD[0], bad_prompt(marker), GOOD[1]]
    good0, bad, good1 = _generate(llm, prompts, GREEDY)
    assert bad.finished and bad.outputs[0].finish_reason == "error"
    assert list(bad.outputs[0].token_ids) == []
    assert [list(good0.outputs[0].token_ids), list(good1.outputs[0].token_ids)] == reference
    assert _all_blocks_free(llm)
    # The engine goes on serving, prefix cache included: the good prompts again, equal.
    again = _generate(llm, GOOD, GREEDY)
    assert [list(o.outputs[0].token_ids) for o in again] == reference
    assert _all_blocks_free(llm)


def test_sampled_neighbours_are_untouched(llm, marker):
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=MAX_TOKENS,
                            ignore_eos=True, logprobs=2)
    alone = _generate(llm, GOOD, params)
    good0, bad, good1 = _generate(llm, [GOOD[0], bad_prompt(marker), GOOD[1]], params)
    assert bad.outputs[0].finish_reason == "error" and bad.outputs[0].logprobs in (None, [])
    for before, after in zip(alone, (good0, good1), strict=True):
        assert list(after.outputs[0].token_ids) == list(before.outputs[0].token_ids)
        assert after.outputs[0].finish_reason == "length"
    assert _all_blocks_free(llm)


def test_greedy_neighbours_are_untouched_where_the_c_head_finds_the_fault(
    tiny_llama_dir, marker, monkeypatch
):
    """bfloat16 with int4 weights: the greedy head's C tail marks the faulty row itself."""
    monkeypatch.setenv("PAGEDLLM_INJECT_NONFINITE_TOKEN_ID", str(marker))
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4",
              num_gpu_blocks_override=128)
    head = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner.model.lm_head
    if head._greedy_kernel(torch.zeros(1, head.embedding_dim, dtype=torch.bfloat16)) is None:
        pytest.skip("the C greedy head does not serve here")
    alone = _generate(llm, GOOD, GREEDY)
    good0, bad, good1 = _generate(llm, [GOOD[0], bad_prompt(marker), GOOD[1]], GREEDY)
    assert bad.outputs[0].finish_reason == "error" and list(bad.outputs[0].token_ids) == []
    for before, after in zip(alone, (good0, good1), strict=True):
        assert list(after.outputs[0].token_ids) == list(before.outputs[0].token_ids)
    assert _all_blocks_free(llm)


def test_a_fault_during_speculative_verification(tiny_llama_dir, marker, reference, monkeypatch):
    """The faulty prompt is prefilled in a step that verifies another request's drafts."""
    monkeypatch.setenv("PAGEDLLM_INJECT_NONFINITE_TOKEN_ID", str(marker))
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
             "prompt_lookup_max": 3}
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_gpu_blocks_override=128,
              speculative_config=ngram)
    engine = llm.llm_engine
    engine.add_request("good", {"prompt_token_ids": GOOD[0]}, GREEDY)
    outputs = {}
    for _ in range(3):
        for output in engine.step():
            outputs[output.request_id] = output
    engine.add_request("bad", {"prompt_token_ids": bad_prompt(marker)}, GREEDY)
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = output
    assert outputs["bad"].outputs[0].finish_reason == "error"
    assert list(outputs["good"].outputs[0].token_ids) == reference[0]
    assert _all_blocks_free(llm)
