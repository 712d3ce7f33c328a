"""Greedy output of the whole engine equals transformers' `generate` token for token.

Each prompt is run alone, in a batch of prompts of different lengths, with a KV budget small
enough to force preemption, and with a token budget small enough to split prompts across
steps. The reference is transformers on the same tiny random checkpoint, in float32.
"""

from __future__ import annotations

import random

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from tests.conftest import hf_greedy_tokens

MAX_TOKENS = 20


def _prompts(vocab_size: int, count: int = 9) -> list[list[int]]:
    rng = random.Random(1234)
    lengths = [3, 70, 17, 41, 5, 33, 58, 9, 26][:count]
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def _hf_greedy(model_dir, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return hf_greedy_tokens(model, prompts, MAX_TOKENS)


def _engine_tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def _scheduler(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.scheduler


@pytest.fixture(scope="module", params=["tiny_llama_dir", "tiny_llama3_dir", "tiny_qwen2_dir"])
def model_and_reference(request):
    model_dir = request.getfixturevalue(request.param)
    from transformers import AutoConfig

    prompts = _prompts(AutoConfig.from_pretrained(model_dir).vocab_size)
    return model_dir, prompts, _hf_greedy(model_dir, prompts)


def test_each_prompt_alone(model_and_reference):
    model_dir, prompts, expected = model_and_reference
    llm = LLM(str(model_dir), dtype="float32", max_model_len=256)
    for prompt, want in zip(prompts, expected, strict=True):
        assert _engine_tokens(llm, [prompt]) == [want]


def test_batched(model_and_reference):
    model_dir, prompts, expected = model_and_reference
    llm = LLM(str(model_dir), dtype="float32", max_model_len=256)
    assert _engine_tokens(llm, prompts) == expected


def test_preemption_under_small_kv_budget(model_and_reference):
    model_dir, prompts, expected = model_and_reference
    # 12 usable blocks of 8 tokens cannot hold all 9 requests (≈ 400 tokens) at once.
    llm = LLM(
        str(model_dir), dtype="float32", max_model_len=96, block_size=8,
        num_gpu_blocks_override=13,
    )
    assert _engine_tokens(llm, prompts) == expected
    scheduler = _scheduler(llm)
    assert scheduler.num_preemptions > 0
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 12


def test_chunked_prefill_small_token_budget(model_and_reference):
    model_dir, prompts, expected = model_and_reference
    # A 16-token budget splits every prompt longer than 16 tokens across steps.
    llm = LLM(str(model_dir), dtype="float32", max_model_len=256, max_num_batched_tokens=16)
    assert max(len(p) for p in prompts) > 16
    assert _engine_tokens(llm, prompts) == expected


def test_small_batches_and_block_size_one(model_and_reference):
    model_dir, prompts, expected = model_and_reference
    llm = LLM(
        str(model_dir), dtype="float32", max_model_len=256, block_size=1, max_num_seqs=3,
        max_num_batched_tokens=40,
    )
    assert _engine_tokens(llm, prompts) == expected


def test_prefill_capped_beside_decodes(model_and_reference, monkeypatch):
    model_dir, prompts, expected = model_and_reference
    # 3 seats and a 40-token budget: later prompts come in while others decode, 16 prompt
    # tokens a step (the floor: at most 2 decode beside them).
    llm = LLM(str(model_dir), dtype="float32", max_model_len=256, max_num_seqs=3,
              max_num_batched_tokens=40, prefill_tokens_per_decode=1)
    scheduler = _scheduler(llm)
    caps = []
    prefill_cap = type(scheduler)._prefill_cap
    monkeypatch.setattr(type(scheduler), "_prefill_cap",
                        lambda self: caps.append(prefill_cap(self)) or caps[-1])
    assert _engine_tokens(llm, prompts) == expected
    assert 16 in caps  # the cap was on in some steps
    default = EngineArgs(model=str(model_dir), dtype="float32").create_engine_config()
    assert default.scheduler_config.prefill_tokens_per_decode == 0  # no cap
