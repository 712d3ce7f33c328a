"""The soak benchmark's 40-second version (benchmarks/soak.py): 256 streaming clients on the
tiny model with random prompt and output lengths, 10% hanging up mid-stream and 5% sending
bad parameters. Pass: no 5xx, no hung request, every bad request refused with the OpenAI
error JSON, every KV block free at the end (/metrics), resident memory growing less than 5%
from the end of the 20-second warm-up to the end of the load, and a clean exit on SIGTERM."""

from __future__ import annotations

import asyncio

from benchmarks.soak import SoakConfig, run_soak, start_server, stop_server


def test_soak_for_40_seconds(tiny_llama_dir, tmp_path):
    process, base_url = start_server(
        str(tiny_llama_dir), ["--max-model-len", "1024", "--num-gpu-blocks-override", "4096"],
        tmp_path / "server.log")
    try:
        config = SoakConfig(clients=256, duration_s=40, warmup_s=20, max_prompt_words=100,
                            max_output_tokens=64, stall_timeout_s=60, seed=1)
        report = asyncio.run(run_soak(base_url, config, process.pid))
    finally:
        exit_code = stop_server(process)
    assert report.passed, (report.failures, report.server_errors[:3], report.client_errors[:3])
    assert report.completed > 256 and report.disconnected > 0 and report.bad_sent > 0
    assert report.kv_usage_at_end == 0 and report.rss_growth_pct is not None
    assert exit_code == 0
