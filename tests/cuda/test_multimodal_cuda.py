"""Vision-language models on a real GPU (skipped elsewhere; see conftest.py): the engine on
CUDA gives transformers' greedy float32 tokens (transformers on the CPU) with 0, 1 and 3
images per prompt in one batch, small chunks splitting images, prefix caching on, each
architecture; LLaVA also under preemption, recomputed and swapped to the host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pagedllm.core.swap_manager import SwapManager
from tests.multimodal.tiny_vlm import (
    QWEN2VL_IMAGE,
    check_engine_matches_transformers,
    make_tiny_gemma3,
    make_tiny_idefics3,
    make_tiny_llava,
    make_tiny_qwen2_vl,
    video_prompts,
)

from .test_cuda_backend import KV_CACHE_BYTES


def _on_cuda(llm: Any) -> None:
    """The engine ran its model (vision tower included) on the GPU."""
    worker = llm.llm_engine.engine_core.engine_core.executor.worker
    assert worker.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in worker.model_runner.model.parameters())


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_llava_on_cuda_matches_transformers(preemption_mode: str, tiny_tokenizer_dir: Path,
                                            tmp_path: Path, monkeypatch) -> None:
    path = make_tiny_llava(tmp_path / "llava", tiny_tokenizer_dir, "clip", "llama", "default",
                           -2)
    swaps = []
    swap_out = SwapManager.swap_out
    monkeypatch.setattr(SwapManager, "swap_out",
                        lambda self, *args: swaps.append(args) or swap_out(self, *args))
    # 24 blocks of 4 tokens cannot hold the batch: requests are preempted.
    llm = check_engine_matches_transformers(
        path, "<image>", max_model_len=80, max_num_batched_tokens=8,
        num_gpu_blocks_override=24, preemption_mode=preemption_mode, swap_space=0.01,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
    )
    assert llm.llm_engine.engine_core.engine_core.scheduler.num_preemptions > 0
    assert bool(swaps) == (preemption_mode == "swap")  # swapped to the host, or recomputed
    _on_cuda(llm)


@pytest.mark.parametrize(("version", "video"), [("2", False), ("2.5", True)])
def test_qwen2_vl_on_cuda_matches_transformers(version: str, video: bool,
                                               tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    path = make_tiny_qwen2_vl(tmp_path / "qwen2_vl", tiny_tokenizer_dir, version)
    llm = check_engine_matches_transformers(
        path, QWEN2VL_IMAGE, prompts=video_prompts() if video else None, max_model_len=512,
        max_num_batched_tokens=16, kv_cache_memory_bytes=KV_CACHE_BYTES,
    )
    _on_cuda(llm)


def test_gemma3_images_on_cuda_match_transformers(tiny_tokenizer_dir: Path,
                                                  tmp_path: Path) -> None:
    """Soft tokens attending both ways (the reference backend's `key_ends`) on the GPU."""
    path = make_tiny_gemma3(tmp_path / "gemma3", tiny_tokenizer_dir, sliding_window=3)
    llm = check_engine_matches_transformers(
        path, "<start_of_image>", max_model_len=96, max_num_batched_tokens=6,
        num_gpu_blocks_override=96, kv_cache_memory_bytes=KV_CACHE_BYTES,
    )
    _on_cuda(llm)


def test_idefics3_on_cuda_matches_transformers(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    path = make_tiny_idefics3(tmp_path / "idefics3", tiny_tokenizer_dir, True)
    llm = check_engine_matches_transformers(path, "<image>", max_model_len=512,
                                            max_num_batched_tokens=8,
                                            kv_cache_memory_bytes=KV_CACHE_BYTES)
    _on_cuda(llm)
