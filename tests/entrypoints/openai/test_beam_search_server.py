"""use_beam_search in completions and chat (vLLM's extra): the n best beams, best first, the
same as `LLM.beam_search` gives offline on the same model; streamed too; fields beam search
does not combine with answer 400 naming it."""

from __future__ import annotations

import json

import pytest

from pagedllm import LLM
from pagedllm.sampling_params import BeamSearchParams

from .conftest import MODEL_NAME

PROMPT = "The capital of"


@pytest.fixture(scope="module")
def offline_beams(tiny_llama_dir, http) -> list[str]:
    prompt_ids = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT}).json()
    llm = LLM(str(tiny_llama_dir), max_model_len=256)
    [output] = llm.beam_search([{"prompt_token_ids": prompt_ids["tokens"]}],
                               BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True))
    return [sequence.text for sequence in output.sequences]


def test_completion_beams_equal_the_offline_search(http, offline_beams):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 6, "n": 3,
            "use_beam_search": True, "ignore_eos": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert [c["text"] for c in choices] == offline_beams
    assert all(c["finish_reason"] == "length" for c in choices)
    assert response.json()["usage"]["completion_tokens"] == 18

    streamed: dict[int, str] = {}
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert [streamed[i] for i in range(3)] == offline_beams


def test_chat_beams(client):
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=5,
        n=2, extra_body={"use_beam_search": True, "ignore_eos": True, "return_token_ids": True},
    )
    assert len(response.choices) == 2
    # Two beams: different tokens (a random model's texts may decode alike).
    assert response.choices[0].token_ids != response.choices[1].token_ids
    assert response.usage.completion_tokens == 10


def test_beam_search_refuses_fields_it_would_ignore(http):
    for extra in ({"logprobs": 2}, {"stop": ["x"]}, {"logit_bias": {"5": 3}}):
        response = http.post("/v1/completions", json={
            "model": MODEL_NAME, "prompt": PROMPT, "n": 2, "use_beam_search": True, **extra})
        assert response.status_code == 400, extra
        error = response.json()["error"]
        assert error["param"] == "use_beam_search" and next(iter(extra)) in error["message"]
