"""`pagedllm bench throughput|latency|serve`, run as a user runs them (the console script's
module in a subprocess), on the tiny model: each finishes, shows its progress bar and
reports numbers consistent with the workload it was given."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.entrypoints.openai.conftest import REPO, start_server, stop_server


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "pagedllm.entrypoints.cli", "bench", *args],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_throughput(tiny_llama_dir, tmp_path):
    out = tmp_path / "throughput.json"
    result = _bench("throughput", "--model", str(tiny_llama_dir), "--num-prompts", "12",
                    "--input-len", "24", "--output-len", "10", "--dtype", "float32",
                    "--output-json", str(out))
    report = json.loads(out.read_text())
    assert report["num_requests"] == 12 and report["output_tokens"] == 120
    assert report["total_num_tokens"] == 12 * 24 + 120
    assert report["requests_per_second"] > 0
    assert "Throughput:" in result.stdout and "Processed prompts" in result.stderr


def test_latency(tiny_llama_dir, tmp_path):
    out = tmp_path / "latency.json"
    result = _bench("latency", "--model", str(tiny_llama_dir), "--batch-size", "3",
                    "--input-len", "8", "--output-len", "6", "--num-iters-warmup", "1",
                    "--num-iters", "4", "--output-json", str(out))
    report = json.loads(out.read_text())
    assert len(report["latencies"]) == 4 and report["avg_latency"] > 0
    assert report["percentiles"]["10"] <= report["percentiles"]["99"]
    assert "Avg latency:" in result.stdout and "Profiling iterations" in result.stderr


@pytest.mark.parametrize("dataset", ["random", "words"])
def test_serve(tiny_llama_dir, tmp_path, dataset):
    server = start_server([str(tiny_llama_dir), "--served-model-name", "bench-me"],
                          tmp_path / "server.log")
    try:
        out = tmp_path / "serve.json"
        result = _bench("serve", "--base-url", server.base_url, "--num-prompts", "8",
                        "--input-len", "20", "--output-len", "7", "--max-concurrency", "4",
                        "--dataset-name", dataset, "--tokenizer", str(tiny_llama_dir),
                        "--output-json", str(out))
    finally:
        stop_server(server)
    summary = json.loads(out.read_text())
    assert summary["completed"] == 8 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 8 * 7
    if dataset == "random":  # token ids: exactly the asked length
        assert summary["total_input_tokens"] == 8 * 20
    assert summary["ttft_ms"]["mean"] > 0 and summary["itl_ms"]["median"] > 0
    assert "Serving Benchmark Result: bench-me" in result.stdout
    assert "Requests" in result.stderr  # the progress bar
