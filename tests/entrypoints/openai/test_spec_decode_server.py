"""`pagedllm serve --speculative-config`: the same completions as the offline engine without
speculation, and the spec_decode counters in /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams
from tests.entrypoints.openai.conftest import (
    API_KEY,
    http_client,
    metric,
    start_server,
    stop_server,
)

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}
PROMPT = "one two three one two three one two three one two"


@pytest.fixture(scope="module")
def spec_server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("spec_server")
    running = start_server(
        [str(tiny_llama_dir), "--dtype", "float32", "--max-model-len", "256",
         "--api-key", API_KEY, "--speculative-config", json.dumps(SPEC)],
        tmp / "server.log",
    )
    yield running
    stop_server(running)


def test_completions_equal_plain_decoding_and_metrics_count_drafts(spec_server, tiny_llama_dir):
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256)
    want = plain.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=40),
                          use_tqdm=False)[0].outputs[0].text
    with http_client(spec_server) as http:
        body = {"model": str(tiny_llama_dir), "prompt": PROMPT, "max_tokens": 40,
                "temperature": 0}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == want
        streamed = ""
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed += json.loads(line[6:])["choices"][0]["text"]
        assert streamed == want
        text = http.get("/metrics").text
    drafts = metric(text, "pagedllm:spec_decode_num_drafts_total")
    accepted = metric(text, "pagedllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0
    assert metric(text, "pagedllm:spec_decode_num_draft_tokens_total") >= accepted
    per_pos = "pagedllm:spec_decode_num_accepted_tokens_per_pos_total"
    if accepted:
        assert metric(text, per_pos, position="0") > 0


def test_bad_speculative_config_fails_at_start(tiny_llama_dir, tmp_path):
    with pytest.raises(RuntimeError, match="prompt_lookup_max"):
        start_server(
            [str(tiny_llama_dir), "--speculative-config", '{"prompt_lookup_max": 0}'],
            tmp_path / "server.log",
        )
