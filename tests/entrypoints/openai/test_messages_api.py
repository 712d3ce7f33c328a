"""POST /v1/messages (Anthropic's Messages API) through the official anthropic client:
text in and out (the same words as chat), system prompts, stop reasons, a forced tool use
and its result, streaming events adding up to the whole message, errors in Anthropic's
shape; the server's API key taken as x-api-key."""

from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic")

from .conftest import API_KEY, MODEL_NAME  # noqa: E402

# This client version no longer takes `temperature` as an argument; the API still does.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0) as c:
        yield c


def test_text_message_matches_chat(claude, client):
    message = claude.messages.create(model=MODEL_NAME, max_tokens=6, system="Be brief.",
                                     messages=[{"role": "user", "content": "Hello there"}],
                                     extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens <= 6 and message.usage.input_tokens > 0
    chat = client.chat.completions.create(
        model=MODEL_NAME, max_tokens=6, temperature=0,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hello there"}])
    assert message.content[0].text == chat.choices[0].message.content


def test_max_tokens_stop_reason(claude):
    message = claude.messages.create(model=MODEL_NAME, max_tokens=3,
                                     messages=[{"role": "user", "content": "Count"}],
                                     extra_body={**GREEDY, "ignore_eos": True})
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_forced_tool_use_and_result(claude):
    tools = [{"name": "get_weather", "description": "The weather",
              "input_schema": {"type": "object",
                               "properties": {"city": {"enum": ["Paris", "Rome"]}},
                               "required": ["city"]}}]
    message = claude.messages.create(
        model=MODEL_NAME, max_tokens=300, extra_body=GREEDY, tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}])
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses[0].name == "get_weather"
    assert uses[0].input["city"] in ("Paris", "Rome")
    follow = claude.messages.create(
        model=MODEL_NAME, max_tokens=4, extra_body=GREEDY, tools=tools,
        tool_choice={"type": "none"},
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [block.model_dump() for block in uses]},
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": uses[0].id,
                                                "content": "sunny"}]}])
    assert follow.usage.input_tokens > message.usage.input_tokens


def test_stream_adds_up_to_the_message(claude):
    kwargs = dict(model=MODEL_NAME, max_tokens=6, extra_body=GREEDY,
                  messages=[{"role": "user", "content": "Hello there"}])
    with claude.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    whole = claude.messages.create(**kwargs)
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason


def test_errors_have_anthropics_shape(claude, http):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL_NAME, max_tokens=4, messages=[])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=4,
                               messages=[{"role": "user", "content": "x"}])
    response = http.post("/v1/messages", json={"model": MODEL_NAME,
                                               "messages": [{"role": "user",
                                                             "content": "x"}]})
    assert response.status_code == 400
    assert response.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens is required (an integer)."}}
