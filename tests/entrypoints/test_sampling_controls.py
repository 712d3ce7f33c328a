"""Penalties, logit_bias, allowed_token_ids and bad_words through the whole engine.

Greedy decoding with penalties is replayed step by step on transformers' logits with the
plain per-row reference of tests/layers/test_sampler_penalties.py: the tokens must agree.
"""

from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams
from tests.layers.test_sampler_penalties import _reference_row


@pytest.fixture(scope="module")
def setup(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, num_gpu_blocks_override=64)
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    return llm, reference


def _reference_greedy(model, prompt: list[int], params: SamplingParams, steps: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0, -1].tolist()
        adjusted = _reference_row(logits, params, tokens, len(prompt))
        tokens.append(max(range(len(adjusted)), key=adjusted.__getitem__))
    return tokens[len(prompt) :]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"repetition_penalty": 1.8},
        {"repetition_penalty": 0.5},
        {"frequency_penalty": 2.0, "presence_penalty": 2.0},
        {"frequency_penalty": -1.5, "presence_penalty": -0.5},
        {"repetition_penalty": 0.7, "frequency_penalty": -0.5, "logit_bias": {17: 2.5, 40: 1.0}},
    ],
)
def test_greedy_with_penalties_matches_reference(setup, kwargs):
    llm, reference = setup
    # The prompt holds tokens the model likes to repeat, so every setting changes the output.
    prompt = [219, 120, 262, 39, 250, 23, 17, 40]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, **kwargs)
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == _reference_greedy(reference, prompt, params, 10)
    plain = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    plain_ids = llm.generate({"prompt_token_ids": prompt}, plain, use_tqdm=False)[0].outputs[0]
    assert out.token_ids != plain_ids.token_ids


def test_allowed_token_ids_and_bias(setup):
    llm, _ = setup
    allowed = SamplingParams(temperature=0.8, seed=0, max_tokens=12, allowed_token_ids=[7, 8, 9])
    out = llm.generate("The quick", allowed, use_tqdm=False)[0].outputs[0]
    assert set(out.token_ids) <= {7, 8, 9}
    biased = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logit_bias={42: 100})
    assert llm.generate("The quick", biased, use_tqdm=False)[0].outputs[0].token_ids == [42] * 5


def test_bad_words_never_completed(setup):
    llm, _ = setup
    tokenizer = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    baseline = llm.generate("Paged attention", greedy, use_tqdm=False)[0].outputs[0]
    word = tokenizer.decode(baseline.token_ids[:2]).strip() or "the"
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, bad_words=[word])
    request, _ = llm.llm_engine.input_processor.process("probe", "x", params)
    banned = request.data.sampling_params.bad_words_token_ids
    assert banned
    out = llm.generate("Paged attention", params, use_tqdm=False)[0].outputs[0].token_ids
    for seq in banned:
        assert all(out[i : i + len(seq)] != seq for i in range(len(out)))
