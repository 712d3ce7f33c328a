"""The whole engine on the Triton attention backend (in Triton's interpreter on CPU): greedy
float32 tokens equal transformers' with requests batched, prefills chunked, a shared prefix
cached and requests preempted: Qwen 3 (GQA, head size 24 padded to 32 in the kernel),
Gemma 3 (sliding-window and global layers in separate KV cache groups) and Mistral's
window."""

from __future__ import annotations

from pathlib import Path

import pytest

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
