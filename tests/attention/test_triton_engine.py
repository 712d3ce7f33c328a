"""The whole engine on the Triton attention backend (in Triton's interpreter on CPU): greedy
float32 tokens equal transformers' with requests batched, prefills chunked, a shared prefix
cached and requests preempted: Qwen 3 (GQA, head size 24 padded to 32 in the kernel),
Gemma 3 (sliding-window and global layers in separate KV cache groups) and Mistral's
window."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ..models.test_architectures_e2e import check_engine_matches_transformers, prompts

__all__ = ["prompts"]  # the module-scoped fixture, used by name below

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "mistral_window"])
def test_engine_on_triton_matches_transformers(
    arch: str, prompts: list[list[int]], tiny_tokenizer_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    llm = check_engine_matches_transformers(arch, prompts, tiny_tokenizer_dir, tmp_path)
    worker = llm.llm_engine.engine_core.engine_core.executor.worker
    assert worker.backend.name == "triton"


def test_int8_cache_gives_the_torch_backends_tokens(tiny_llama_dir: Path, monkeypatch) -> None:
    """kv_cache_dtype="int8" on the Triton backend: the same greedy tokens as the torch
    reference over the same int8 cache (float32, batched, chunked)."""
    from pagedllm import LLM, SamplingParams

    batch = [{"prompt_token_ids": [5 + i, 9, 30, 2 * i + 1, 77] * (1 + i)} for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    results = []
    for backend in ("torch", "triton"):
        monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", backend)
        llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="int8",
                  max_num_batched_tokens=16, num_gpu_blocks_override=64, max_model_len=128)
        worker = llm.llm_engine.engine_core.engine_core.executor.worker
        assert worker.backend.name == backend and worker.kv_caches[0].dtype == torch.int8
        outputs = llm.generate(batch, params, use_tqdm=False)
        results.append([list(o.outputs[0].token_ids) for o in outputs])
    assert results[0] == results[1]
