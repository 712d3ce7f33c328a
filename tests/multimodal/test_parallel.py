"""Images across ranks: tensor parallelism (the text model split over 2 ranks, each rank
running the vision tower and the encoder cache) and pipeline parallelism (the first stage
embeds the images) give transformers' greedy tokens."""

from __future__ import annotations

from pathlib import Path

from .tiny_vlm import (
    QWEN2VL_IMAGE,
    check_engine_matches_transformers,
    make_tiny_llava,
    make_tiny_qwen2_vl,
)


def test_llava_over_two_pipeline_stages(tiny_tokenizer_dir, tmp_path: Path):
    """The first stage embeds the images; steps of at most 24 tokens."""
    path = make_tiny_llava(tmp_path / "llava", tiny_tokenizer_dir)
    check_engine_matches_transformers(path, "<image>", max_model_len=128,
                                      max_num_batched_tokens=24, pipeline_parallel_size=2)


def test_qwen2_vl_over_two_tensor_parallel_ranks(tiny_tokenizer_dir, tmp_path: Path):
    """Each rank runs the tower and keeps its encoder cache; M-RoPE positions on every
    rank."""
    path = make_tiny_qwen2_vl(tmp_path / "qwen2_vl", tiny_tokenizer_dir)
    check_engine_matches_transformers(path, QWEN2VL_IMAGE, max_model_len=256,
                                      tensor_parallel_size=2)
