"""vLLM-compatible observability: after some traffic, /metrics serves every metric that
deploy/grafana/pagedllm-dashboard.json queries and every one vLLM's own published Grafana
dashboard queries (vllm-project/vllm, examples/online_serving/prometheus_grafana/
grafana.json: the names below), under vLLM's `vllm:` names, with the same values as the
`pagedllm:` ones; the Prometheus scrape config points at /metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .conftest import MODEL_NAME, metric

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"

# Every series vLLM's published dashboard reads.
VLLM_DASHBOARD_SERIES = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum", "vllm:time_per_output_token_seconds_count",
    "vllm:num_requests_running", "vllm:num_requests_swapped", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc",
    "vllm:cpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_sum",
]  # fmt: skip


def _served_series(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)(?:\{| )", text, re.M)}


def _metrics_after_traffic(client, http) -> str:
    for _ in range(2):  # two tokens apart at least: inter-token latencies exist
        client.completions.create(model=MODEL_NAME, prompt="Grafana probe", max_tokens=4,
                                  temperature=0, extra_body={"ignore_eos": True})
    return http.get("/metrics").text


def test_vllm_dashboard_series_are_served(client, http):
    served = _served_series(_metrics_after_traffic(client, http))
    assert [name for name in VLLM_DASHBOARD_SERIES if name not in served] == []


def test_our_dashboard_queries_only_served_series(client, http):
    text = _metrics_after_traffic(client, http)
    served = _served_series(text)
    dashboard = json.loads((DEPLOY / "grafana" / "pagedllm-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = {name for expr in exprs for name in re.findall(r"vllm:[\w:]+", expr)}
    assert len(queried) >= 15
    assert sorted(queried - served) == []
    # The vLLM names carry the same values as pagedllm's.
    for name in ("num_requests_running", "kv_cache_usage_perc", "prompt_tokens_total",
                 "request_success_total"):
        assert metric(text, "vllm:" + name) == metric(text, "pagedllm:" + name)
    assert metric(text, "vllm:gpu_cache_usage_perc") == metric(text, "vllm:kv_cache_usage_perc")


def test_prometheus_scrapes_metrics():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]
