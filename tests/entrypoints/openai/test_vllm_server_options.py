"""vLLM server flags and routes a user moving from `vllm serve` passes and calls:
--max-logprobs (and a request's -1 logprobs counted as the vocabulary), --root-path behind a
proxy, --enable-request-id-headers, --enable-force-include-usage,
--return-tokens-as-token-ids, /tokenizer_info, /load, --generation-config,
--enable-per-request-metrics, ORCA load reports, --logits-processors with vllm_xargs, sleep
mode's routes, prompt_embeds, the flags accepted for compatibility, and SageMaker's
/invocations."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from .conftest import RunningServer, http_client, start_server, stop_server

MODEL = "opts-llama"


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("options_server")
    running = start_server(
        [str(tiny_llama_dir), "--served-model-name", MODEL, "--max-model-len", "256",
         "--num-gpu-blocks-override", "256", "--max-logprobs", "5", "--root-path", "/llm",
         "--enable-request-id-headers", "--enable-force-include-usage",
         "--return-tokens-as-token-ids", "--enable-tokenizer-info-endpoint",
         "--enable-server-load-tracking", "--enable-prompt-tokens-details",
         "--show-hidden-metrics-for-version", "0.32", "--generation-config", "vllm",
         "--enable-per-request-metrics", "--enable-sleep-mode", "--enable-prompt-embeds",
         "--logits-processors",
         "tests.logits_processor.test_plugins:TargetTokenProcessor"],
        tmp / "server.log")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with http_client(server) as client:
        yield client


def _completion(**fields):
    return {"model": MODEL, "prompt": "Hello there", "max_tokens": 3, "temperature": 0,
            **fields}


@pytest.mark.parametrize(("fields", "param"), [
    ({"logprobs": 6}, "logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 6}, "prompt_logprobs"),
])
def test_more_logprobs_than_max_logprobs_answer_400(http, fields, param):
    response = http.post("/v1/completions", json=_completion(**fields))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "greater than max allowed: 5" in error["message"] and error["type"] == "BadRequestError"
    ok = http.post("/v1/completions", json=_completion(logprobs=5, prompt_logprobs=5))
    assert ok.status_code == 200  # the server keeps serving


def test_routes_answer_under_the_root_path_too(http):
    for path in ("/v1/completions", "/llm/v1/completions"):
        response = http.post(path, json=_completion())
        assert response.status_code == 200, (path, response.text)


def test_request_id_header_is_echoed_or_made(http):
    given = http.post("/v1/completions", json=_completion(), headers={"X-Request-Id": "abc-1"})
    assert given.headers["x-request-id"] == "abc-1"
    made = http.get("/health")
    assert made.status_code == 200 and len(made.headers["x-request-id"]) >= 16


def test_streams_end_with_usage_unasked_and_tokens_are_ids(http):
    chunks = []
    body = _completion(stream=True, logprobs=1)
    with http.stream("POST", "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    tokens = [t for c in chunks if c["choices"] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert len(tokens) == 3 and all(t.startswith("token_id:") for t in tokens)
    # A request's own field wins over the server's default.
    own = http.post("/v1/completions", json=_completion(logprobs=1,
                                                        return_tokens_as_token_ids=False))
    assert not any(t.startswith("token_id:")
                   for t in own.json()["choices"][0]["logprobs"]["tokens"])


def test_invocations_serves_chat_and_completion_bodies(http):
    chat = http.post("/invocations", json={"model": MODEL, "max_tokens": 2,
                                           "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    completion = http.post("/invocations", json=_completion())
    assert completion.status_code == 200 and completion.json()["object"] == "text_completion"
    bad = http.post("/invocations", json={"model": MODEL, "nothing": 1})
    assert bad.status_code == 400 and "/invocations" in bad.json()["error"]["message"]
    invalid = http.post("/invocations", json=_completion(max_tokens="many"))
    assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "max_tokens"


def test_tokenizer_info_and_load(http):
    info = http.get("/tokenizer_info")
    assert info.status_code == 200
    body = info.json()
    assert body["vocab_size"] > 0 and body["tokenizer_class"] and "eos_token" in body
    assert http.get("/load").json() == {"server_load": 0}
    assert http.post("/v1/completions", json=_completion()).status_code == 200
    assert http.get("/load").json() == {"server_load": 0}  # counted down again


def test_load_counts_a_request_until_its_last_byte():
    """The middleware alone: a model request counts while its app runs; /health does not."""
    import asyncio
    from types import SimpleNamespace

    from pagedllm.entrypoints.openai.api_server import LoadTrackingMiddleware

    state = SimpleNamespace(server_load=0)
    release = asyncio.Event()

    async def app(scope, receive, send):
        await release.wait()

    async def run() -> list[int]:
        middleware = LoadTrackingMiddleware(app, state)
        seen = []
        task = asyncio.create_task(middleware({"type": "http", "path": "/v1/completions"},
                                              None, None))
        await asyncio.sleep(0)
        seen.append(state.server_load)
        health = asyncio.create_task(middleware({"type": "http", "path": "/health"},
                                                None, None))
        await asyncio.sleep(0)
        seen.append(state.server_load)
        release.set()
        await asyncio.gather(task, health)
        seen.append(state.server_load)
        return seen

    assert asyncio.run(run()) == [1, 1, 0]


def test_generation_config_source(tmp_path):
    from pagedllm.entrypoints.openai.serving_engine import _generation_defaults

    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.3,
                                                               "top_k": 7}))
    assert _generation_defaults("vllm", str(folder)) == {}
    assert _generation_defaults("auto", str(folder)) == {"temperature": 0.3, "top_k": 7}
    assert _generation_defaults(str(folder), str(tmp_path)) == {"temperature": 0.3, "top_k": 7}


def test_cache_salt_separates_prefix_caches(http):
    prompt = list(range(5, 45))  # token ids: two full blocks

    def cached(**salt) -> int:
        body = _completion(prompt=prompt, max_tokens=1, **salt)
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        details = response.json()["usage"].get("prompt_tokens_details") or {}
        return details.get("cached_tokens", 0)

    cached(cache_salt="a")
    assert cached(cache_salt="a") == 32
    assert cached(cache_salt="b") == 0


def test_reset_prefix_cache_and_server_info(http):
    prompt = list(range(5, 45))
    body = _completion(prompt=prompt, max_tokens=1)
    http.post("/v1/completions", json=body)
    cached = http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens_details"]
    assert cached["cached_tokens"] == 32
    assert http.post("/reset_prefix_cache").status_code == 200
    after = http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens_details"]
    assert (after or {}).get("cached_tokens", 0) == 0
    info = http.get("/server_info").json()
    assert info["version"] and "max_model_len=256" in info["pagedllm_config"]


_TIMING_FIELDS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms",
                  "mean_itl_ms", "tokens_per_second"}


def _check_timing(metrics, num_tokens):
    assert set(metrics) == _TIMING_FIELDS, metrics
    assert metrics["time_to_first_token_ms"] >= 0 and metrics["queue_time_ms"] >= 0
    assert metrics["generation_time_ms"] >= 0 and metrics["tokens_per_second"] > 0
    # mean ITL is the generation time spread over the gaps between tokens.
    expected_itl = metrics["generation_time_ms"] / (num_tokens - 1)
    assert metrics["mean_itl_ms"] == pytest.approx(expected_itl)


def test_per_request_metrics_on_responses_of_one_choice(http):
    completion = http.post("/v1/completions", json=_completion(max_tokens=4, ignore_eos=True))
    assert completion.status_code == 200, completion.text
    _check_timing(completion.json()["metrics"], 4)
    chat = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "temperature": 0, "ignore_eos": True})
    _check_timing(chat.json()["metrics"], 3)
    # Several choices or prompts: none (vLLM's rule).
    two = http.post("/v1/completions", json=_completion(n=2, temperature=1.0, seed=1))
    assert "metrics" not in two.json()
    many = http.post("/v1/completions", json=_completion(prompt=["a b", "c d"]))
    assert "metrics" not in many.json()


def test_per_request_metrics_ride_on_the_usage_chunk(http):
    chunks = []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert all("metrics" not in chunk for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    _check_timing(chunks[-1]["metrics"], 3)


@pytest.mark.parametrize("fmt", ["TEXT", "json"])
def test_orca_load_report_when_asked(http, fmt):
    response = http.post("/v1/completions", json=_completion(),
                         headers={"endpoint-load-metrics-format": fmt})
    assert response.status_code == 200
    report = response.headers["endpoint-load-metrics"]
    if fmt == "TEXT":
        assert report.startswith("TEXT named_metrics.kv_cache_usage_perc=")
        assert ", named_metrics.num_requests_waiting=" in report
        values = [float(part.split("=")[1]) for part in report[5:].split(", ")]
        assert all(v >= 0 for v in values)
    else:
        assert report.startswith("JSON ")
        named = json.loads(report[5:])["named_metrics"]
        assert set(named) == {"kv_cache_usage_perc", "num_requests_waiting"}
    # Not asked for, or an unknown format: no header, the answer unchanged.
    plain = http.post("/v1/completions", json=_completion())
    assert "endpoint-load-metrics" not in plain.headers
    odd = http.post("/v1/completions", json=_completion(),
                    headers={"endpoint-load-metrics-format": "BIN"})
    assert odd.status_code == 200 and "endpoint-load-metrics" not in odd.headers


def test_logits_processor_plugin_takes_vllm_xargs(http):
    target = 77
    completion = http.post("/v1/completions", json=_completion(
        max_tokens=4, ignore_eos=True, return_token_ids=True,
        vllm_xargs={"target_token": target}))
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["token_ids"] == [target] * 4
    chat = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "ignore_eos": True, "return_token_ids": True, "vllm_xargs": {"target_token": target}})
    assert chat.json()["choices"][0]["token_ids"] == [target] * 3
    # The plugin's validate_params refuses a bad argument: 400, and the server serves on.
    bad = http.post("/v1/completions", json=_completion(vllm_xargs={"target_token": "x"}))
    assert bad.status_code == 400 and "is not int" in bad.json()["error"]["message"]
    plain = http.post("/v1/completions", json=_completion(return_token_ids=True))
    assert plain.json()["choices"][0]["token_ids"] != [target] * 3


def test_sleep_routes_hold_requests_until_wake_up(http, server):
    import threading

    assert http.get("/is_sleeping").json() == {"is_sleeping": False}
    expected = http.post("/v1/completions", json=_completion(return_token_ids=True)).json()
    assert http.post("/sleep", params={"level": 1}).status_code == 200
    try:
        assert http.get("/is_sleeping").json() == {"is_sleeping": True}
        # A request sent while asleep waits, then is answered after /wake_up.
        answers = []
        thread = threading.Thread(target=lambda: answers.append(http.post(
            "/v1/completions", json=_completion(return_token_ids=True), timeout=60)))
        thread.start()
        thread.join(timeout=1.5)
        assert thread.is_alive() and not answers
    finally:
        assert http.post("/wake_up", params={"tags": ["kv_cache", "weights"]}).status_code == 200
    thread.join(timeout=60)
    assert answers[0].status_code == 200
    assert answers[0].json()["choices"][0]["token_ids"] == expected["choices"][0]["token_ids"]
    assert http.get("/is_sleeping").json() == {"is_sleeping": False}
    bad = http.post("/sleep", params={"level": 5})
    assert bad.status_code == 400 and "level must be 1 or 2" in bad.json()["error"]["message"]
    assert http.get("/is_sleeping").json() == {"is_sleeping": False}


def _b64_tensor(tensor):
    import base64
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def test_prompt_embeds_answer_as_their_tokens(http, tiny_llama_dir):
    from safetensors.torch import load_file

    ids = [5, 9, 11, 13, 17]
    table = load_file(str(tiny_llama_dir / "model.safetensors"))["model.embed_tokens.weight"]
    embeds = table[ids].float()
    body = _completion(max_tokens=4, ignore_eos=True, return_token_ids=True)
    from_ids = http.post("/v1/completions", json={**body, "prompt": ids}).json()
    one = http.post("/v1/completions", json={**body, "prompt": None,
                                             "prompt_embeds": _b64_tensor(embeds)})
    assert one.status_code == 200, one.text
    assert one.json()["choices"][0]["token_ids"] == from_ids["choices"][0]["token_ids"]
    assert one.json()["usage"]["prompt_tokens"] == len(ids)
    # A list of them, then the text prompts: choices in that order.
    both = http.post("/v1/completions", json={
        **body, "prompt_embeds": [_b64_tensor(embeds), _b64_tensor(embeds[:3])],
        "prompt": ids}).json()
    assert [c["index"] for c in both["choices"]] == [0, 1, 2]
    assert both["choices"][0]["token_ids"] == both["choices"][2]["token_ids"]
    for bad, text in [("not base64!", "base64"), (_b64_tensor(embeds[:, :3]), "shape"),
                      (_b64_tensor({"a": embeds}), "one tensor")]:
        response = http.post("/v1/completions", json={**body, "prompt_embeds": bad})
        assert response.status_code == 400, (text, response.text)
        error = response.json()["error"]
        assert error["param"] == "prompt_embeds" and text in error["message"]
    echo = http.post("/v1/completions", json={**body, "prompt_embeds": _b64_tensor(embeds),
                                              "echo": True})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "prompt_embeds"
