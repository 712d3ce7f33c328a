"""Bad input: each case is a 4xx in the OpenAI error shape naming the field, and the server
keeps serving with nothing leaked."""

from __future__ import annotations

import time

import pytest

from .conftest import MAX_MODEL_LEN, MODEL_NAME, metric

GOOD_MESSAGES = [{"role": "user", "content": "hi"}]

CASES = [
    # (path, body, status, param or None, text in message)
    ("/v1/completions", {"prompt": "x", "model": "nope"}, 404, "model", "does not exist"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature", "non-negative"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p", "(0, 1]"),
    ("/v1/completions", {"prompt": "x", "top_k": -5}, 400, "top_k", "top_k"),
    ("/v1/completions", {"prompt": "x", "min_p": 2}, 400, "min_p", "min_p"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n", "at least 1"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens", "at least 1"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens", "integer"),
    ("/v1/completions", {"prompt": "x", "n": 2, "temperature": 0}, 400, "n", "greedy"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop", "empty string"),
    # The failed constraint's type is named, as pydantic (and vLLM) name it.
    ("/v1/completions", {"prompt": "x", "seed": 2**70}, 400, "seed", "less_than_equal"),
    ("/v1/completions", {"prompt": "x", "seed": -2**70}, 400, "seed", "greater_than_equal"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**6]}, 400, "stop_token_ids",
     "out-of-vocab"),
    ("/v1/completions", {"prompt": [1, 2, 10**6]}, 400, "prompt", "vocab"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", "decoder prompt cannot be empty"),
    ("/v1/completions", {"prompt": [[]]}, 400, "prompt", "decoder prompt cannot be empty"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt", None),
    ("/v1/completions", {"prompt_embeds": "AAAA"}, 400, "prompt_embeds",
     "--enable-prompt-embeds"),
    ("/v1/completions", {"prompt": "x", "kv_transfer_params": {"do_remote_decode": True}}, 400,
     "kv_transfer_params", "--kv-transfer-config"),
    ("/v1/completions", {}, 400, None, "prompt"),
    ("/v1/completions", {"prompt": [5] * MAX_MODEL_LEN}, 400, "prompt",
     "maximum context length"),
    ("/v1/completions", {"prompt": [5] * 100, "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens",
     "maximum context length"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, None,
     "stream"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias", None),
    # Every bad key is named (vLLM's), not only the first.
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1, "5": 2, "x9": 3}}, 400,
     "logit_bias", "'abc', 'x9'"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "logprobs": 1}, 400,
     "use_beam_search", "logprobs"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", "non-empty"),
    ("/v1/chat/completions", {}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": GOOD_MESSAGES, "max_completion_tokens": 0}, 400,
     "max_tokens", "at least 1"),
    ("/v1/chat/completions", {"messages": GOOD_MESSAGES, "top_logprobs": -3}, 400, None,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": GOOD_MESSAGES, "model": "nope"}, 404, "model", None),
    ("/v1/chat/completions", {"messages": GOOD_MESSAGES, "tools": [{"type": "function"}],
                              "tool_choice": "auto"}, 400, "tools.0.function", "Field required"),
    ("/v1/chat/completions", {"messages": GOOD_MESSAGES, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice",
     "--enable-auto-tool-choice"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 5000}]}, 400,
     "messages", "maximum context length"),
]


@pytest.mark.parametrize("path,body,status,param,text", CASES,
                         ids=[f"{i}-{c[0].rsplit('/', 1)[-1]}" for i, c in enumerate(CASES)])
def test_bad_input_is_a_clean_4xx(http, path, body, status, param, text):
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    if param is not None:
        assert error["param"] == param or (param in (error["param"] or "")), error
    if text is not None:
        assert text in error["message"], error["message"]


def test_invalid_json(http):
    response = http.post("/v1/completions", content=b"{not json",
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


def test_unknown_route_and_method(http):
    assert http.get("/v1/nothing").json()["error"]["code"] == 404
    assert http.get("/v1/completions").status_code == 405


def test_unknown_fields_are_ignored(http):
    body = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "not_a_field": {"a": 1}}
    assert http.post("/v1/completions", json=body).status_code == 200


def test_nothing_leaks_after_errors(http):
    for path, body, *_ in CASES:
        http.post(path, json=body)
    assert http.get("/health").status_code == 200
    deadline = time.monotonic() + 10
    while True:
        text = http.get("/metrics").text
        running = metric(text, "pagedllm:num_requests_running", model_name=MODEL_NAME)
        usage = metric(text, "pagedllm:kv_cache_usage_perc", model_name=MODEL_NAME)
        if (running, usage) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (running, usage) == (0, 0)
    ok = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200
