"""/v1/chat/completions: templates, message forms, streaming deltas, logprobs, extras."""

from __future__ import annotations

import dataclasses

import openai
import pytest

from pagedllm.sampling_params import SamplingParams

from .conftest import MODEL_NAME

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something about foxes."},
]


def _chat(client, messages=MESSAGES, max_tokens=12, **kwargs):
    return client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=max_tokens, temperature=0, **kwargs)


def test_basic_response_shape(client, http):
    out = _chat(client, extra_body={"ignore_eos": True})
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    assert out.model == MODEL_NAME and out.system_fingerprint.startswith("fp_")
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    expected_prompt = http.post("/tokenize", json={"messages": MESSAGES}).json()["count"]
    assert out.usage.prompt_tokens == expected_prompt
    assert out.usage.completion_tokens == 12


def test_content_parts_and_roles(client):
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Say something about foxes."}]},
    ]
    assert _chat(client, parts).choices[0].message.content == _chat(
        client).choices[0].message.content
    history = MESSAGES + [{"role": "assistant", "content": "Foxes."},
                          {"role": "user", "content": "More."}]
    assert _chat(client, history).usage.prompt_tokens > _chat(client).usage.prompt_tokens


def test_stream_role_then_deltas(client):
    expected = _chat(client, max_tokens=20, extra_body={"ignore_eos": True})
    chunks = list(_chat(client, max_tokens=20, stream=True,
                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.choices[0].message.content
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_n_streams_each_choice(client):
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=5, n=2, temperature=1.0, seed=3,
        stream=True))
    roles = {c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"}
    finishes = {c.choices[0].index for c in chunks if c.choices[0].finish_reason}
    assert roles == finishes == {0, 1}


def test_max_completion_tokens_wins(client):
    out = _chat(client, max_tokens=9, max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3


def test_chat_template_and_generation_prompt(client, http):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    out = _chat(client, extra_body={"chat_template": template, "add_generation_prompt": False})
    plain = "You are terse.Say something about foxes."
    count = http.post("/tokenize", json={"prompt": plain, "add_special_tokens": False}).json()
    assert out.usage.prompt_tokens == count["count"]
    with_prompt = _chat(client).usage.prompt_tokens
    without = _chat(client, extra_body={"add_generation_prompt": False}).usage.prompt_tokens
    assert with_prompt > without


def test_echo_and_stop(client):
    history = MESSAGES + [{"role": "assistant", "content": "Foxes are"}]
    out = _chat(client, history, extra_body={"echo": True, "add_generation_prompt": False,
                                            "continue_final_message": True})
    assert out.choices[0].message.content.startswith("Foxes are")
    text = _chat(client, max_tokens=20, extra_body={"ignore_eos": True}).choices[0].message.content
    start = next(i for i in range(4, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    out = _chat(client, max_tokens=20, stop=stop, extra_body={"ignore_eos": True})
    assert out.choices[0].message.content == text[: text.index(stop)]
    assert out.choices[0].finish_reason == "stop"


def test_logprobs(client):
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    if "logprobs" not in fields:
        with pytest.raises(openai.BadRequestError, match="not supported yet"):
            _chat(client, logprobs=True, top_logprobs=2)
        return
    out = _chat(client, max_tokens=4, logprobs=True, top_logprobs=2,
                extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    streamed = list(_chat(client, max_tokens=4, logprobs=True, top_logprobs=1, stream=True,
                          extra_body={"ignore_eos": True}))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]
    assert len(tokens) == 4


def test_extra_params_accepted(client):
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0.7, top_p=0.9, seed=5,
        user="u", extra_body={"top_k": 10, "min_p": 0.01, "min_tokens": 2, "ignore_eos": True,
                              "skip_special_tokens": True, "stop_token_ids": [2],
                              "include_stop_str_in_output": False, "priority": 0})
    assert out.usage.completion_tokens == 4


def test_bad_content_part_and_top_logprobs(client):
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, image)
    assert info.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        _chat(client, top_logprobs=2)
