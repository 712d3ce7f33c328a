"""A server with --kv-transfer-config: the connector's traffic in /metrics under vLLM's
names (kv_transfer_bytes_total by direction, kv_transfer_seconds, kv_transfer_failures_total),
and a repeated prompt answered from the folder after the prefix cache was reset."""

from __future__ import annotations

import json

from tests.entrypoints.openai.conftest import http_client, metric, start_server, stop_server


def test_transfer_metrics_and_a_load_after_reset(tiny_llama_dir, tmp_path):
    config = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "kv")}}
    server = start_server([str(tiny_llama_dir), "--max-model-len", "256",
                           "--num-gpu-blocks-override", "64", "--block-size", "16",
                           "--kv-transfer-config", json.dumps(config)], tmp_path / "log")
    try:
        with http_client(server) as http:
            body = {"prompt": [7, 3, 11, 5] * 10, "max_tokens": 4, "temperature": 0,
                    "ignore_eos": True}
            first = http.post("/v1/completions", json=body).json()
            assert http.post("/reset_prefix_cache").status_code == 200
            second = http.post("/v1/completions", json=body).json()
            assert second["choices"][0]["text"] == first["choices"][0]["text"]
            assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
            text = http.get("/metrics").text
            for prefix in ("pagedllm:", "vllm:"):
                sent = metric(text, prefix + "kv_transfer_bytes_total", direction="sent")
                received = metric(text, prefix + "kv_transfer_bytes_total",
                                  direction="received")
                assert sent > 0 and received == sent  # the two blocks, out then in
                assert metric(text, prefix + "kv_transfer_seconds_count") >= 2
                assert metric(text, prefix + "kv_transfer_failures_total") == 0
    finally:
        stop_server(server)
