"""Images across ranks: tensor parallelism (the text model split over 2 ranks, each rank
running the vision tower and the encoder cache) and pipeline parallelism (the first stage
embeds the images) give transformers' greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from .tiny_vlm import (
    QWEN2VL_IMAGE,
    check_engine_matches_transformers,
    make_tiny_llava,
    make_tiny_qwen2_vl,
)


@pytest.mark.parametrize("layout", [dict(tensor_parallel_size=2),
                                    dict(pipeline_parallel_size=2)])
def test_llava_over_two_ranks(layout, tiny_tokenizer_dir, tmp_path: Path):
    path = make_tiny_llava(tmp_path / "llava", tiny_tokenizer_dir)
    check_engine_matches_transformers(path, "<image>", max_model_len=128,
                                      max_num_batched_tokens=24, **layout)


def test_qwen2_vl_over_two_ranks(tiny_tokenizer_dir, tmp_path: Path):
    """M-RoPE positions on every rank."""
    path = make_tiny_qwen2_vl(tmp_path / "qwen2_vl", tiny_tokenizer_dir)
    check_engine_matches_transformers(path, QWEN2VL_IMAGE, max_model_len=256,
                                      tensor_parallel_size=2)
