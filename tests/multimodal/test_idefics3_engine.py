"""Idefics3 (SmolVLM's architecture) through the engine: greedy float32 tokens equal
transformers' with 0, 1 and 3 images per prompt in one batch, each image split into tiles
plus a global view (row/column tags between the image tokens stay text), small chunks,
prefix caching on."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams

from .tiny_vlm import hf_vlm_greedy, make_tiny_idefics3, random_image

MAX_TOKENS = 8


def _prompts() -> list[dict]:
    one = {"prompt": "Describe <image> please", "multi_modal_data": {"image": random_image(1)}}
    three = {
        "prompt": "<image> and <image> then <image> end",
        "multi_modal_data": {"image": [random_image(2), random_image(3, (64, 30)),
                                       random_image(1, (20, 16))]},
    }
    other_image = {"prompt": one["prompt"], "multi_modal_data": {"image": random_image(4)}}
    return [one, three, {"prompt": "The quick brown fox"}, other_image, dict(one)]


@pytest.mark.parametrize(("splitting", "budget"), [(True, 8), (False, 512)])
def test_idefics3_matches_transformers(splitting, budget, tiny_tokenizer_dir, tmp_path: Path):
    path = make_tiny_idefics3(tmp_path / "idefics3", tiny_tokenizer_dir, splitting)
    prompts = _prompts()
    expected = hf_vlm_greedy(path, prompts, MAX_TOKENS)
    assert expected[0] != expected[3]  # the image decides the output
    llm = LLM(str(path), dtype="float32", max_model_len=512, block_size=4,
              max_num_batched_tokens=budget, enable_prefix_caching=True)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                           use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.make_stats().prefix_cache_hits > 0
    assert not scheduler.encoder.cache.users
