"""The disaggregated-prefill proxy over a prefill instance (kv_producer) and a decode
instance (kv_consumer) sharing a folder of KV blocks: 32 concurrent greedy requests, plain
and streamed, completions and chat, give one instance's tokens; the decode instance loads
the prompts' blocks instead of computing them; /health and /v1/models answer."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from pagedllm.entrypoints.disagg_proxy import build_app
from tests.entrypoints.openai.conftest import free_port, start_server, stop_server


def _config(role, folder):
    return json.dumps({"kv_connector": "SharedStorageConnector", "kv_role": role,
                       "kv_connector_extra_config": {"shared_storage_path": str(folder)}})


@pytest.fixture(scope="module")
def instances(tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("disagg")
    common = [str(tiny_llama_dir), "--max-model-len", "256", "--block-size", "16",
              "--num-gpu-blocks-override", "256", "--dtype", "float32"]
    prefill = start_server([*common, "--kv-transfer-config", _config("kv_producer", tmp / "kv")],
                           tmp / "prefill.log")
    decode = start_server([*common, "--kv-transfer-config", _config("kv_consumer", tmp / "kv"),
                           "--no-enable-prefix-caching"], tmp / "decode.log")
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
            # The decode side read the prompt's full blocks from the producer's.
            prompt_tokens = got["usage"]["prompt_tokens"]
            assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == (
                (prompt_tokens - 1) // 16 * 16)
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
