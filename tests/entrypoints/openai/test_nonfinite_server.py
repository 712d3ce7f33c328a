"""Through the server, a request whose forward goes non-finite fails alone: a 500 with the
OpenAI error JSON (a stream: an error event after its 200), while the requests beside it
answer exactly what they answer alone; the server keeps serving and every KV block returns."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.worker.test_nonfinite_requests import (
    GOOD,
    MAX_TOKENS,
    bad_prompt,
    greedy_reference,
    pick_marker,
)

from .conftest import API_KEY, MODEL_NAME, metric, start_server, stop_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def setup(tiny_llama_dir, tmp_path_factory):
    reference = greedy_reference(tiny_llama_dir)
    marker = pick_marker(reference)
    server = start_server(
        [str(tiny_llama_dir), "--served-model-name", MODEL_NAME, "--api-key", API_KEY,
         "--max-model-len", "256", "--num-gpu-blocks-override", "128", "--dtype", "float32"],
        tmp_path_factory.mktemp("nonfinite") / "server.log",
        env={"PAGEDLLM_INJECT_NONFINITE_TOKEN_ID": str(marker)},
    )
    yield server, reference, marker  # the marker is in neither GOOD nor its outputs
    stop_server(server)


def _body(prompt: list[int], stream: bool) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def _complete(base_url: str, prompt: list[int], stream: bool) -> tuple[int, list[dict]]:
    """(status, the JSON bodies: one, or each SSE event's)."""
    url = f"{base_url}/v1/completions"
    with httpx.stream("POST", url, json=_body(prompt, stream), headers=HEADERS,
                      timeout=120) as response:
        if not stream or response.status_code != 200:
            return response.status_code, [json.loads(response.read())]
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return response.status_code, events


def _text(events: list[dict]) -> str:
    return "".join(event["choices"][0]["text"] for event in events if event.get("choices"))


def test_the_faulty_request_fails_alone(setup):
    server, _, marker = setup
    alone = [_text(_complete(server.base_url, prompt, False)[1]) for prompt in GOOD]
    jobs = [(GOOD[0], True), (bad_prompt(marker), False), (GOOD[1], False),
            (bad_prompt(marker), True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: _complete(server.base_url, *job), jobs))
    (good0_status, good0), (bad_status, bad), (good1_status, good1), (sbad_status, sbad) = (
        results)
    assert (good0_status, good1_status) == (200, 200)
    assert [_text(good0), _text(good1)] == alone
    assert bad_status == 500
    error = bad[0]["error"]
    assert error["type"] == "InternalServerError" and error["code"] == 500
    assert "non-finite" in error["message"]
    assert sbad_status == 200 and sbad[-1]["error"]["code"] == 500  # after the stream's 200
    # Still serving, and nothing held.
    status, after = _complete(server.base_url, GOOD[1], False)
    assert status == 200 and _text(after) == alone[1]
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    assert metric(text, "pagedllm:num_requests_running") == 0
    assert metric(text, "pagedllm:kv_cache_usage_perc") == 0
    assert metric(text, "pagedllm:request_success_total", finished_reason="error") == 2

