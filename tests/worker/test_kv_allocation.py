"""The KV cache is allocated lazily: only the null block is written before use."""

from __future__ import annotations

import gc

import torch

from pagedllm import LLM, SamplingParams
from pagedllm.utils.native import release_free_heap


def _core(llm: LLM):
    return llm.llm_engine.engine_core.engine_core


def test_null_block_is_zero_and_outputs_unchanged(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128)
    worker = _core(llm).executor.worker
    for cache in worker.model_runner.kv_caches:
        # [2, num_blocks, block_size, kv_heads, head_size]: block 0 pads block tables.
        assert torch.count_nonzero(cache[:, 0]) == 0
    params = SamplingParams(temperature=0.0, max_tokens=8)
    first = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params, use_tqdm=False)
    assert len(first[0].outputs[0].token_ids) == 8


def test_reset_prefix_cache_forgets_cached_blocks(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    llm.generate([{"prompt_token_ids": list(range(3, 40))}], params, use_tqdm=False)
    pool = _core(llm).scheduler.kv_cache_manager.block_pool
    assert pool.get_num_cached_blocks() > 0
    assert llm.reset_prefix_cache()
    assert pool.get_num_cached_blocks() == 0


def _resident_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / (1 << 20)


def test_prefault_makes_the_whole_cache_resident_at_start(tiny_llama_dir, monkeypatch):
    """PAGEDLLM_CPU_KVCACHE_PREFAULT=1: the cache's memory is taken at start (a memory limit
    is met then, not under load); by default only what is used becomes resident."""
    budget = 256 << 20

    def grown_by(prefault: bool) -> float:
        monkeypatch.setenv("PAGEDLLM_CPU_KVCACHE_PREFAULT", "1" if prefault else "0")
        # Engines of earlier calls and tests are freed now, not while this one is measured
        # (their memory going back to the OS mid-measurement hid part of the growth).
        gc.collect()
        release_free_heap()
        before = _resident_mib()
        llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128,
                  kv_cache_memory_bytes=budget)
        grown = _resident_mib() - before
        if prefault:  # zeros, like the null block
            caches = _core(llm).executor.worker.model_runner.kv_caches
            assert all(torch.count_nonzero(cache) == 0 for cache in caches)
        return grown

    lazy = grown_by(False)
    eager = grown_by(True)
    assert eager > lazy + 0.8 * (budget >> 20)
