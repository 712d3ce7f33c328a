"""benchmarks/profile_throughput.py profiles one offline pass over token-id prompts (its
warm-up once handed the engine bare lists of ids, which LLM.generate refuses, as vLLM's does)."""

from __future__ import annotations

import sys
from pathlib import Path

from pagedllm import LLM
from tests.conftest import load_benchmark


def test_profiled_pass_runs_token_id_prompts(tiny_llama_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    profile = load_benchmark("profile_throughput")
    try:
        llm = LLM(str(tiny_llama_dir), max_model_len=64)
        profiler, elapsed = profile.profiled_pass(llm, [[5, 17, 42], [8, 9], [3] * 7, [1, 2]], 4)
    finally:
        sys.modules.pop("common", None)
    assert elapsed > 0
    assert profiler.getstats()  # the pass ran under the profiler
