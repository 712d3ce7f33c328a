"""Gemma 3 with images through the engine: greedy float32 tokens equal transformers' with
0, 1 and 3 images per prompt in one batch, an image's soft tokens attending to each other
both ways (also across a sliding layer's window), small chunks that never split an image,
prefix caching on, and recompute preemption."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams

from .tiny_vlm import hf_vlm_greedy, make_tiny_gemma3, random_image

MAX_TOKENS = 8
BOI = "<start_of_image>"


def _prompts() -> list[dict]:
    one = {"prompt": f"Describe {BOI} please", "multi_modal_data": {"image": random_image(1)}}
    three = {
        "prompt": f"{BOI} and {BOI} then {BOI} end",
        "multi_modal_data": {"image": [random_image(2), random_image(3, (64, 30)),
                                       random_image(1)]},
    }
    other_image = {"prompt": one["prompt"], "multi_modal_data": {"image": random_image(4)}}
    return [one, three, {"prompt": "The quick brown fox"}, other_image, dict(one)]


@pytest.mark.parametrize("budget", [6, 64])
def test_gemma3_with_images_matches_transformers(budget, tiny_tokenizer_dir, tmp_path: Path):
    path = make_tiny_gemma3(tmp_path / "gemma3", tiny_tokenizer_dir, sliding_window=3)
    prompts = _prompts()
    expected = hf_vlm_greedy(path, prompts, MAX_TOKENS)
    assert expected[0] != expected[3]  # the image decides the output
    llm = LLM(str(path), dtype="float32", max_model_len=96, block_size=4,
              max_num_batched_tokens=budget, enable_prefix_caching=True,
              num_gpu_blocks_override=96, preemption_mode="recompute")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.make_stats().prefix_cache_hits > 0
    assert not scheduler.encoder.cache.users
    manager = scheduler.kv_cache_manager
    assert manager.get_num_free_blocks() == manager.num_usable_blocks


def test_gemma3_token_budget_below_an_image_is_refused(tiny_tokenizer_dir, tmp_path: Path):
    path = make_tiny_gemma3(tmp_path / "gemma3", tiny_tokenizer_dir)
    with pytest.raises(ValueError, match="max_num_batched_tokens=3 is below the 4 tokens"):
        LLM(str(path), dtype="float32", max_model_len=96, max_num_batched_tokens=3)
