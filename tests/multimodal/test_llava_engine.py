"""LLaVA through the engine: greedy float32 tokens equal transformers' with 0, 1 and 3
images per prompt in one batch, chunked prefill splitting images, prefix caching on."""

from __future__ import annotations

from pathlib import Path

import pytest

from .tiny_vlm import check_engine_matches_transformers, make_tiny_llava


@pytest.mark.parametrize(
    ("tower", "text", "strategy", "layer"),
    [("clip", "llama", "default", -2), ("siglip", "mistral", "full", [-3, -1])],
)
def test_llava_matches_transformers(tower, text, strategy, layer, tiny_tokenizer_dir,
                                    tmp_path: Path):
    path = make_tiny_llava(tmp_path / "llava", tiny_tokenizer_dir, tower, text, strategy, layer)
    # 8-token chunks split every image's tokens over steps; 24 blocks of 4 tokens cannot
    # hold the batch: requests are preempted and recomputed (their images encoded again or
    # read from the encoder cache).
    llm = check_engine_matches_transformers(
        path, "<image>", max_model_len=80, max_num_batched_tokens=8,
        num_gpu_blocks_override=24, preemption_mode="recompute",
    )
    assert llm.llm_engine.engine_core.engine_core.scheduler.num_preemptions > 0
