"""/v1/models, /health, /ping, /version, /tokenize, /detokenize, /metrics, and the API key."""

from __future__ import annotations

import httpx
import openai
import pytest

from pagedllm import __version__

from .conftest import API_KEY, MAX_MODEL_LEN, MODEL_NAME, metric


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME, "tiny-alias"]
    assert all(m.object == "model" and m.owned_by == "pagedllm" for m in models.data)
    assert models.data[0].max_model_len == MAX_MODEL_LEN


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics"])
def test_open_endpoints_need_no_key(server, path):
    response = httpx.get(server.base_url + path)
    assert response.status_code == 200
    if path == "/version":
        assert response.json() == {"version": __version__}


def test_api_key_guards_v1(server):
    assert httpx.get(f"{server.url_v1}/models").status_code == 401
    wrong = httpx.get(f"{server.url_v1}/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    error = wrong.json()["error"]  # OpenAI's error body
    assert error["type"] == "AuthenticationError" and error["code"] == 401
    assert "API key" in error["message"]
    assert httpx.post(f"{server.url_v1}/completions", json={"prompt": "x"}).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url_v1, api_key="wrong", max_retries=0).models.list()
    ok = httpx.get(f"{server.url_v1}/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200


def test_tokenize_detokenize_roundtrip(http):
    tokens = http.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})
    body = tokens.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_MODEL_LEN
    assert len(body["token_strs"]) == body["count"]
    text = http.post("/detokenize", json={"tokens": body["tokens"]}).json()["prompt"]
    assert text.endswith("Hello world")
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 2
    bad = http.post("/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert http.post("/tokenize", json={"prompt": "x", "model": "nope"}).status_code == 404


METRIC_NAMES = [
    "pagedllm:num_requests_running", "pagedllm:num_requests_waiting",
    "pagedllm:kv_cache_usage_perc", "pagedllm:prompt_tokens_total",
    "pagedllm:generation_tokens_total", "pagedllm:request_success_total",
    "pagedllm:num_preemptions_total", "pagedllm:prefix_cache_queries_total",
    "pagedllm:prefix_cache_hits_total", "pagedllm:time_to_first_token_seconds_count",
    "pagedllm:inter_token_latency_seconds_count",
    "pagedllm:request_time_per_output_token_seconds_count",
    "pagedllm:e2e_request_latency_seconds_count", "pagedllm:request_prompt_tokens_count",
    "pagedllm:request_generation_tokens_count", "pagedllm:model_execute_seconds_total",
]


def test_metrics_count_tokens_and_requests(client, http):
    before = http.get("/metrics").text
    out = client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=7,
                                    temperature=0, extra_body={"ignore_eos": True})
    after = http.get("/metrics").text
    for name in METRIC_NAMES:
        metric(after, name)
    labels = {"model_name": MODEL_NAME}

    def delta(name, **extra):
        # A counter has no sample before its first increment when this test runs first.
        try:
            earlier = metric(before, name, **labels, **extra)
        except KeyError:
            earlier = 0.0
        return metric(after, name, **labels, **extra) - earlier

    assert delta("pagedllm:generation_tokens_total") == 7
    assert delta("pagedllm:prompt_tokens_total") == out.usage.prompt_tokens
    assert delta("pagedllm:request_success_total", finished_reason="length") == 1
    assert delta("pagedllm:e2e_request_latency_seconds_count") == 1
    # One latency sample per engine step that gave the request tokens (vLLM's): the server
    # takes one step at a time (config.py's for_online_serving), so one a token.
    assert delta("pagedllm:inter_token_latency_seconds_count") == 6
    assert delta("pagedllm:model_execute_seconds_total") > 0  # the runner's busy time grew
    # --block-size 16 on the command line beat `block-size: 4` in the YAML config.
    assert metric(after, "pagedllm:cache_config_info", block_size="16") == 1
    assert metric(after, "pagedllm:num_requests_running", **labels) == 0


def test_a_stream_counts_a_latency_sample_a_token(client, http):
    """A streamed request's tokens come one a step: 6 gaps for 7 tokens."""
    name = "pagedllm:inter_token_latency_seconds_count"
    labels = {"model_name": MODEL_NAME}
    try:
        before = metric(http.get("/metrics").text, name, **labels)
    except KeyError:  # no sample yet when this test runs first
        before = 0.0
    stream = client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=7,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text  # the stream carried the tokens
    assert metric(http.get("/metrics").text, name, **labels) - before == 6
