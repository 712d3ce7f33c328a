"""LLaVA through the engine: greedy float32 tokens equal transformers' with 0, 1 and 3
images per prompt in one batch, chunked prefill splitting images, prefix caching on."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams

from .tiny_vlm import hf_vlm_greedy, make_tiny_llava, random_image

MAX_TOKENS = 8


def _prompts() -> list[dict]:
    one = {"prompt": "Describe <image> please", "multi_modal_data": {"image": random_image(1)}}
    three = {
        "prompt": "<image> and <image> then <image> end",
        "multi_modal_data": {"image": [random_image(2), random_image(3, (64, 30)),
                                       random_image(1)]},
    }
    same_text_other_image = {
        "prompt": "Describe <image> please", "multi_modal_data": {"image": random_image(4)}
    }
    text_only = {"prompt": "The quick brown fox"}
    return [one, three, text_only, same_text_other_image, dict(one)]


@pytest.mark.parametrize(
    ("tower", "text", "strategy", "layer"),
    [("clip", "llama", "default", -2), ("siglip", "mistral", "full", [-3, -1])],
)
def test_llava_matches_transformers(tower, text, strategy, layer, tiny_tokenizer_dir,
                                    tmp_path: Path):
    path = make_tiny_llava(tmp_path / "llava", tiny_tokenizer_dir, tower, text, strategy, layer)
    prompts = _prompts()
    expected = hf_vlm_greedy(path, prompts, MAX_TOKENS)
    assert expected[0] != expected[3]  # the image decides the output
    # 8-token chunks split every image's tokens over steps; the repeated prompt hits the
    # prefix cache, the same text with another image must not.
    # 24 blocks of 4 tokens cannot hold the batch: requests are preempted and recomputed
    # (their images encoded again or read from the encoder cache).
    llm = LLM(str(path), dtype="float32", max_model_len=80, block_size=4,
              max_num_batched_tokens=8, enable_prefix_caching=True,
              num_gpu_blocks_override=24, preemption_mode="recompute")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.make_stats().prefix_cache_hits > 0
    assert scheduler.num_preemptions > 0
    assert scheduler.kv_cache_manager.get_num_free_blocks() == (
        scheduler.kv_cache_manager.num_usable_blocks
    )
    assert scheduler.encoder is not None and not scheduler.encoder.cache.users
