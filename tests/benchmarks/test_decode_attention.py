"""benchmarks/decode_attention.py times the CPU decode attention with every layer's cache
cold and with one cache hot; it refuses contexts its cache cannot hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pagedllm.attention import cpu_kernel
from tests.conftest import load_benchmark

pytestmark = pytest.mark.skipif(not cpu_kernel.is_available(torch.bfloat16),
                                reason="no C attention kernel for bfloat16 here")


@pytest.fixture
def bench(monkeypatch):
    """The benchmark module (it imports benchmarks/common.py as `common`)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    return load_benchmark("decode_attention")


def test_prints_a_cold_and_a_hot_step_with_their_rates(bench, capsys, tmp_path):
    out = tmp_path / "attn.json"
    bench.main(["--requests", "2", "--context", "40", "--layers", "2", "--repeats", "1",
                "--output-json", str(out)])
    lines = capsys.readouterr().out.splitlines()
    # 2 layers x 2 requests x 40 positions x 3 kv heads x 64 values x (K + V) x 2 bytes:
    # 61 kB, printed as 0 MB
    for name, line in zip(("cold", "hot"), lines, strict=True):
        assert re.fullmatch(rf"{name}: [0-9.]+ ms a step of 2 layers, 0 MB of KV, [0-9.]+ GB/s",
                            line), line
    assert out.exists()


def test_a_context_beyond_the_cache_is_refused(bench):
    with pytest.raises(SystemExit, match="do not fit"):
        bench.step_calls(requests=64, context=1024, layers=1)
