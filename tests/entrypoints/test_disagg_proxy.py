"""The disaggregated-prefill proxy over a prefill instance (kv_producer) and a decode
instance (kv_consumer), the decode side pulling the prompts' blocks over TCP from the prefill
side (TcpConnector, vLLM's pull style), prefix caching on both: 32 concurrent greedy
requests, plain and streamed, completions and chat, give one instance's tokens; the decode
instance loads the prompts' blocks instead of computing them; /health and /v1/models
answer; both sides hold no KV once idle. A producer that is gone is an error answer (a 500
JSON, or an SSE error event in a stream), never a hang, and the decode side serves on."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from pagedllm.entrypoints.disagg_proxy import build_app
from tests.entrypoints.openai.conftest import free_port, metric, start_server, stop_server


def _config(role, port):
    return json.dumps({"kv_connector": "TcpConnector", "kv_role": role, "kv_port": port,
                       "kv_connector_extra_config": {"pull_timeout_s": 5}})


@pytest.fixture(scope="module")
def instances(tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("disagg")
    common = [str(tiny_llama_dir), "--max-model-len", "256", "--block-size", "16",
              "--num-gpu-blocks-override", "256", "--dtype", "float32"]
    prefill = start_server([*common, "--kv-transfer-config",
                            _config("kv_producer", free_port())], tmp / "prefill.log")
    decode = start_server([*common, "--kv-transfer-config",
                           _config("kv_consumer", free_port())], tmp / "decode.log")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app([prefill.base_url], [decode.base_url]),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield prefill, decode, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    stop_server(prefill)
    stop_server(decode)


def _prompt(i):
    return [5 + i % 7, 17, 23, 9, 41 + i] * (8 + i % 5)  # 40-60 tokens: 2-3 full blocks


def test_32_concurrent_requests_equal_one_instance(instances):
    prefill, decode, proxy = instances
    body = {"max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    with httpx.Client(timeout=120) as http:
        # The reference: the prefill instance alone, whole requests (one instance).
        expected = [http.post(prefill.base_url + "/v1/completions",
                              json={**body, "prompt": _prompt(i)}).json()
                    for i in range(32)]

        def through_proxy(i):
            return http.post(proxy + "/v1/completions", json={**body, "prompt": _prompt(i)})

        with ThreadPoolExecutor(32) as pool:
            answers = [r.json() for r in pool.map(through_proxy, range(32))]
        for got, want in zip(answers, expected, strict=True):
            assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
            # The decode side had every prompt token but the last: pulled from the
            # producer, or (prompts sharing a prefix) from its own prefix cache.
            prompt_tokens = got["usage"]["prompt_tokens"]
            assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens - 1
        assert http.get(proxy + "/health").status_code == 200
        assert http.get(proxy + "/v1/models").json()["data"][0]["id"]


def test_streamed_chat_through_the_proxy(instances):
    prefill, _, proxy = instances
    body = {"messages": [{"role": "user", "content": "Tell me about the sea " * 6}],
            "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    with httpx.Client(timeout=120) as http:
        want = http.post(prefill.base_url + "/v1/chat/completions", json=body).json()
        text = ""
        with http.stream("POST", proxy + "/v1/chat/completions",
                         json={**body, "stream": True}) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:])["choices"]:
                        text += choice["delta"].get("content") or ""
        assert text == want["choices"][0]["message"]["content"]
        # A bad request comes back as the prefill instance answered it.
        bad = http.post(proxy + "/v1/chat/completions", json={"messages": []})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_an_instance_that_is_down_is_a_clean_502_not_a_hang(instances):
    from fastapi.testclient import TestClient

    _, decode, _ = instances
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with TestClient(build_app([dead], [decode.base_url])) as client:
        response = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2})
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == 502 and "upstream instance failed" in error["message"]
        assert client.get("/health").status_code == 503


def _idle_usage(server):
    """The instance's KV cache usage once its held and parked requests are done."""
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(server.base_url + "/metrics").text
        usage = metric(text, "vllm:kv_cache_usage_perc")
        if usage == 0.0 or time.monotonic() > deadline:
            return usage, text
        time.sleep(0.2)


def test_both_sides_hold_nothing_once_idle(instances):
    prefill, decode, proxy = instances
    with httpx.Client(timeout=120) as http:
        http.post(proxy + "/v1/completions",
                  json={"prompt": _prompt(3), "max_tokens": 4, "temperature": 0})
    for server in (prefill, decode):
        usage, text = _idle_usage(server)
        assert usage == 0.0
    assert metric(_idle_usage(prefill)[1], "vllm:kv_transfer_bytes_total",
                  direction="sent") > 0
    assert metric(_idle_usage(decode)[1], "vllm:kv_transfer_bytes_total",
                  direction="received") > 0


def test_a_producer_that_is_gone_is_an_error_not_a_hang(tiny_llama_dir, instances,
                                                          tmp_path):
    _, decode, _ = instances
    common = [str(tiny_llama_dir), "--max-model-len", "256", "--block-size", "16",
              "--num-gpu-blocks-override", "256", "--dtype", "float32"]
    doomed = start_server([*common, "--kv-transfer-config",
                           _config("kv_producer", free_port())], tmp_path / "doomed.log")
    body = {"prompt": [31, 32, 33, 34] * 12, "max_tokens": 4, "temperature": 0}
    try:
        with httpx.Client(timeout=120) as http:
            first = http.post(doomed.base_url + "/v1/completions", json={
                **body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
            params = first.json()["kv_transfer_params"]
            assert params["do_remote_prefill"] and params["remote_block_ids"]
    finally:
        stop_server(doomed)  # killed before the decode side pulls
    with httpx.Client(timeout=120) as http:
        before = metric(http.get(decode.base_url + "/metrics").text,
                        "vllm:kv_transfer_failures_total")
        start = time.monotonic()
        with ThreadPoolExecutor(1) as pool:  # plain and streamed at once: one timeout
            plain = pool.submit(http.post, decode.base_url + "/v1/completions",
                                json={**body, "kv_transfer_params": params})
            with http.stream("POST", decode.base_url + "/v1/completions",
                             json={**body, "stream": True, "kv_transfer_params": params}
                             ) as stream:
                events = [line for line in stream.iter_lines() if line.startswith("data: ")]
            answer = plain.result()
        assert answer.status_code == 500
        assert "failed to load" in answer.json()["error"]["message"]
        assert any('"error"' in line for line in events)
        assert time.monotonic() - start < 60  # the pull timeout (5 s), not a hang
        text = http.get(decode.base_url + "/metrics").text
        assert metric(text, "vllm:kv_transfer_failures_total") == before + 2
        # The decode side serves on, and holds nothing.
        again = http.post(decode.base_url + "/v1/completions", json=body)
        assert again.status_code == 200
    assert _idle_usage(decode)[0] == 0.0
