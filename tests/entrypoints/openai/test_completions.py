"""/v1/completions through the official openai client and httpx: every prompt form and param."""

from __future__ import annotations

import dataclasses

import openai
import pytest

from pagedllm.sampling_params import SamplingParams

from .conftest import MODEL_NAME

PROMPT = "The quick brown fox jumps over"
SP_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def _greedy(client, prompt=PROMPT, max_tokens=12, **kwargs):
    return client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, **kwargs)


def test_basic_response_shape_and_usage(client, http):
    out = _greedy(client, extra_body={"ignore_eos": True})
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    assert isinstance(out.created, int) and out.model == MODEL_NAME
    assert out.system_fingerprint and out.system_fingerprint.startswith("fp_")
    num_prompt = http.post("/tokenize", json={"prompt": PROMPT}).json()["count"]
    assert out.usage.prompt_tokens == num_prompt
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == num_prompt + 12
    assert out.choices[0].finish_reason == "length" and out.choices[0].index == 0


def test_model_alias_and_no_model(client, http):
    assert _greedy(client).choices[0].text == client.completions.create(
        model="tiny-alias", prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    response = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert response.status_code == 200 and response.json()["model"] == MODEL_NAME


def test_streaming_concatenates_to_the_same_text(client):
    expected = _greedy(client, max_tokens=24, extra_body={"ignore_eos": True})
    chunks = list(_greedy(client, max_tokens=24, stream=True,
                          stream_options={"include_usage": True},
                          extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.id == chunks[0].id for c in chunks)
    assert chunks[-1].usage.prompt_tokens == expected.usage.prompt_tokens


def test_sse_framing_and_continuous_usage(http):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"
    import json

    chunks = [json.loads(f[6:]) for f in frames[:-1]]
    assert all(c["usage"] is not None for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_prompt_forms(client, http):
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    text = _greedy(client).choices[0].text
    assert _greedy(client, prompt=ids).choices[0].text == text
    batch = _greedy(client, prompt=[PROMPT, "Paged attention"])
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == text
    batch_ids = _greedy(client, prompt=[ids, ids[:3]])
    assert batch_ids.choices[0].text == text and len(batch_ids.choices) == 2
    assert batch_ids.usage.prompt_tokens == len(ids) + 3


def test_n_and_seed(client):
    kwargs = dict(model=MODEL_NAME, prompt=[PROMPT, "Hello"], max_tokens=8, temperature=1.0,
                  n=2, seed=7)
    first = client.completions.create(**kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1, 2, 3]
    second = client.completions.create(**kwargs)
    assert [c.text for c in first.choices] == [c.text for c in second.choices]


def test_echo(client):
    out = _greedy(client, echo=True)
    assert out.choices[0].text == PROMPT + _greedy(client).choices[0].text
    only = _greedy(client, echo=True, max_tokens=0)
    assert only.choices[0].text == PROMPT and only.usage.completion_tokens == 0


def test_stop_strings(client):
    text = _greedy(client, max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
    start = next(i for i in range(4, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    cut = text[: text.index(stop)]
    out = _greedy(client, max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    assert getattr(out.choices[0], "stop_reason", None) == stop
    kept = _greedy(client, max_tokens=24, stop=stop,
                   extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == cut + stop
    streamed = "".join(c.choices[0].text for c in _greedy(
        client, max_tokens=24, stop=[stop], stream=True, extra_body={"ignore_eos": True}))
    assert streamed == cut


def test_stop_token_ids_and_min_tokens(client, http):
    vocab = list(range(384))  # the whole tiny vocabulary
    out = _greedy(client, extra_body={"stop_token_ids": vocab})
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 1
    out = _greedy(client, extra_body={"stop_token_ids": vocab, "min_tokens": 4})
    assert out.usage.completion_tokens >= 4


def test_vllm_extra_sampling_params_are_accepted(client):
    out = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0.8, top_p=0.9, seed=1,
        user="someone",
        extra_body={"top_k": 20, "min_p": 0.05, "ignore_eos": True, "skip_special_tokens": False,
                    "spaces_between_special_tokens": False, "priority": 0,
                    "truncate_prompt_tokens": 3, "some_unknown_field": 1})
    assert out.usage.completion_tokens == 6 and out.usage.prompt_tokens == 3


def test_suffix_is_rejected(client):
    with pytest.raises(openai.BadRequestError) as info:
        _greedy(client, suffix="tail")
    assert info.value.body["param"] == "suffix"


def _supported_or_400(client, field: str, **kwargs):
    """Call; when the engine lacks `field`, expect the server's clear 400 instead."""
    if field in SP_FIELDS:
        return _greedy(client, **kwargs)
    with pytest.raises(openai.BadRequestError) as info:
        _greedy(client, **kwargs)
    assert "not supported yet" in info.value.message
    return None


@pytest.mark.parametrize("kwargs,field", [
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
])
def test_engine_dependent_params(client, kwargs, field):
    out = _supported_or_400(client, field, **kwargs)
    assert out is None or len(out.choices) == 1


def test_best_of(client):
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=1.0, best_of=3)
    if "best_of" in SP_FIELDS:
        assert len(client.completions.create(**kwargs).choices) == 1
    else:
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**kwargs)
    # best_of == n is plain sampling and always works.
    kwargs["best_of"] = 1
    assert len(client.completions.create(**kwargs).choices) == 1


def test_logprobs(client):
    out = _supported_or_400(client, "logprobs", logprobs=2, max_tokens=4)
    if out is None:
        return
    logprobs = out.choices[0].logprobs
    assert len(logprobs.tokens) == 4 == len(logprobs.token_logprobs)
    assert all(len(top) >= 1 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_prompt_logprobs_and_echo_with_logprobs(client, http):
    if "prompt_logprobs" not in SP_FIELDS:
        pytest.skip("the engine has no prompt logprobs yet")
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    out = _greedy(client, max_tokens=2, extra_body={"prompt_logprobs": 1})
    prompt_logprobs = out.choices[0].prompt_logprobs
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    assert all(str(t) in p for t, p in zip(ids[1:], prompt_logprobs[1:], strict=True))
    echoed = _greedy(client, max_tokens=3, echo=True, logprobs=1)
    logprobs = echoed.choices[0].logprobs
    assert len(logprobs.tokens) == len(ids) + 3
    assert logprobs.token_logprobs[0] is None and logprobs.token_logprobs[-1] <= 0
    only = _greedy(client, max_tokens=0, echo=True, logprobs=1).choices[0].logprobs
    assert len(only.tokens) == len(ids)


def test_streamed_logprobs_cover_every_token(client):
    if "logprobs" not in SP_FIELDS:
        pytest.skip("the engine has no logprobs yet")
    chunks = list(_greedy(client, max_tokens=6, logprobs=1, stream=True,
                          extra_body={"ignore_eos": True}))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == 6
