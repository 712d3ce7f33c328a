"""Gemma 3 with images through the engine: greedy float32 tokens equal transformers' with
0, 1 and 3 images per prompt in one batch, an image's soft tokens attending to each other
both ways (also across a sliding layer's window), small chunks that never split an image,
prefix caching on, and recompute preemption."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedllm import LLM

from .tiny_vlm import check_engine_matches_transformers, make_tiny_gemma3


@pytest.mark.parametrize(("budget", "steps"), [(6, 1), (64, 1), (64, 4)])
def test_gemma3_with_images_matches_transformers(
    budget, steps, tiny_tokenizer_dir, tmp_path: Path
):
    """Chunked or not; with 4 decode steps per scheduler step (sliding windows, two KV
    cache groups: the runner's own steps)."""
    path = make_tiny_gemma3(tmp_path / "gemma3", tiny_tokenizer_dir, sliding_window=3)
    check_engine_matches_transformers(path, "<start_of_image>", max_model_len=96,
                                      max_num_batched_tokens=budget, num_gpu_blocks_override=96,
                                      num_scheduler_steps=steps)


def test_gemma3_token_budget_below_an_image_is_refused(tiny_tokenizer_dir, tmp_path: Path):
    path = make_tiny_gemma3(tmp_path / "gemma3", tiny_tokenizer_dir)
    with pytest.raises(ValueError, match="max_num_batched_tokens=3 is below the 4 tokens"):
        LLM(str(path), dtype="float32", max_model_len=96, max_num_batched_tokens=3)
