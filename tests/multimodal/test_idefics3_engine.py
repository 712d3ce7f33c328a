"""Idefics3 (SmolVLM's architecture) through the engine: greedy float32 tokens equal
transformers' with 0, 1 and 3 images per prompt in one batch, each image split into tiles
plus a global view (row/column tags between the image tokens stay text), small chunks,
prefix caching on."""

from __future__ import annotations

from pathlib import Path

import pytest

from .tiny_vlm import check_engine_matches_transformers, make_tiny_idefics3


@pytest.mark.parametrize(("splitting", "budget"), [(True, 8), (False, 512)])
def test_idefics3_matches_transformers(splitting, budget, tiny_tokenizer_dir, tmp_path: Path):
    path = make_tiny_idefics3(tmp_path / "idefics3", tiny_tokenizer_dir, splitting)
    check_engine_matches_transformers(path, "<image>", max_model_len=512,
                                      max_num_batched_tokens=budget)
