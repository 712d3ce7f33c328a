"""Shared by the drafter tests: prompts, and the tiny Llama's plain greedy outputs."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

PROMPTS = [[5, 17, 42, 8, 5, 17, 42], [7, 7, 12] * 5, [101, 55, 23], [9] * 40, [33, 4]]


@pytest.fixture(scope="module")
def plain_outputs(tiny_llama_dir):
    """Greedy outputs (30 tokens) of PROMPTS without speculation, float32."""
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=30)
    outputs = plain.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                             use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]
