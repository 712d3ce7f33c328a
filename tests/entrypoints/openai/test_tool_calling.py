"""Tool calling through the server (tiny random Llama, Hermes parser and template):
forced choices always give calls whose arguments validate, "auto" reads the parser's format
out of the reply, streams assemble in the openai client to the same calls, history with tool
calls renders, and bad tools/tool_choice are 400s naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from tests.entrypoints.openai.conftest import (
    API_KEY,
    RunningServer,
    http_client,
    openai_client,
    start_server,
    stop_server,
)

# A compact ChatML template that renders tools, tool calls and tool results: the tiny
# model's 1,024 positions do not fit the example Hermes template's instructions (that one is
# checked in tests/entrypoints/test_chat_utils.py).
TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "detail": {"type": "object",
                   "properties": {"wind": {"type": "boolean"}},
                   "required": ["wind"], "additionalProperties": False},
        "units": {"anyOf": [{"enum": ["C", "F"]}, {"type": "null"}]},
    },
    "required": ["city", "days", "detail", "units"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Rome?"}]
HERMES_REPLY = (r'Let me check\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
                r'\{"city": "(Paris|Rome)", "days": [1-7], "detail": \{"wind": (true|false)\}, '
                r'"units": null\}\}\n</tool_call>')


@pytest.fixture(scope="module")
def tool_server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[RunningServer]:
    """The tiny model served with auto tool choice, the hermes parser and template."""
    tmp = tmp_path_factory.mktemp("tool_server")
    template = tmp / "template.jinja"
    template.write_text(TEMPLATE)
    running = start_server(
        [str(tiny_llama_dir), "--api-key", API_KEY, "--max-model-len", "1024",
         "--num-gpu-blocks-override", "512", "--enable-auto-tool-choice",
         "--tool-call-parser", "hermes", "--chat-template", str(template)],
        tmp / "server.log")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def tool_client(tool_server: RunningServer) -> Iterator[openai.OpenAI]:
    """The openai client pointed at the tool server."""
    with openai_client(tool_server) as c:
        yield c


@pytest.fixture(scope="module")
def tool_http(tool_server: RunningServer) -> Iterator[httpx.Client]:
    """httpx pointed at the tool server."""
    with http_client(tool_server) as c:
        yield c


def _chat(client: openai.OpenAI, **kwargs):
    kwargs = {"max_tokens": 400, "temperature": 0.0, "messages": MESSAGES, **kwargs}
    return client.chat.completions.create(model=client.models.list().data[0].id, **kwargs)


def _stream_final(client: openai.OpenAI, **kwargs):
    """The openai client's own assembly of a streamed reply."""
    kwargs = {"max_tokens": 400, "temperature": 0.0, "messages": MESSAGES, **kwargs}
    with client.chat.completions.stream(model=client.models.list().data[0].id,
                                        **kwargs) as stream:
        return stream.get_final_completion()


def _calls(message) -> list[tuple[str, dict]]:
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    for name, arguments in calls:
        jsonschema.validate(arguments, SCHEMAS[name])
    return calls


def test_required_calls_validate_streamed_or_not(tool_client):
    out = _chat(tool_client, tools=TOOLS, tool_choice="required")
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = _calls(choice.message)
    assert calls and all(c.id and c.type == "function" for c in choice.message.tool_calls)
    streamed = _stream_final(tool_client, tools=TOOLS, tool_choice="required")
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert _calls(streamed.choices[0].message) == calls
    assert [c.function.arguments for c in streamed.choices[0].message.tool_calls] == [
        c.function.arguments for c in choice.message.tool_calls]


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_named_function_is_called(tool_client, name):
    choice = {"type": "function", "function": {"name": name}}
    out = _chat(tool_client, tools=TOOLS, tool_choice=choice)
    assert [c[0] for c in _calls(out.choices[0].message)] == [name]
    assert out.choices[0].finish_reason == "tool_calls"
    streamed = _stream_final(tool_client, tools=TOOLS, tool_choice=choice)
    assert _calls(streamed.choices[0].message) == _calls(out.choices[0].message)


def test_parallel_tool_calls_false_gives_one_call(tool_client):
    out = _chat(tool_client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert len(_calls(out.choices[0].message)) == 1


def test_n_choices_each_call(tool_client):
    out = _chat(tool_client, tools=TOOLS, tool_choice="required", n=2, temperature=1.0,
                seed=7)
    assert len(out.choices) == 2
    assert all(_calls(choice.message) for choice in out.choices)


def test_auto_reads_hermes_calls(tool_client):
    # The reply is steered into the Hermes format by a regex; the parser does the rest.
    extra = {"structured_outputs": {"regex": HERMES_REPLY}}
    out = _chat(tool_client, tools=TOOLS, extra_body=extra)
    message = out.choices[0].message
    assert message.content == "Let me check.\n"
    assert [name for name, _ in _calls(message)] == ["get_weather"]
    assert out.choices[0].finish_reason == "tool_calls"
    streamed = _stream_final(tool_client, tools=TOOLS, extra_body=extra)
    assert streamed.choices[0].message.content == "Let me check.\n"
    assert _calls(streamed.choices[0].message) == _calls(message)
    assert streamed.choices[0].finish_reason == "tool_calls"


def test_auto_without_a_call_is_content(tool_client):
    out = _chat(tool_client, tools=TOOLS, tool_choice="auto",
                extra_body={"structured_outputs": {"choice": ["It is sunny."]}})
    assert out.choices[0].message.content == "It is sunny."
    assert not out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "stop"


def _rendered(http: httpx.Client, **body) -> str:
    tokens = http.post("/tokenize", json={"messages": MESSAGES, **body}).json()["tokens"]
    return http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]


def test_tool_choice_none_replies_with_text_and_template_sees_tools(tool_client, tool_http):
    plain = _chat(tool_client, max_tokens=3)
    with_tools = _chat(tool_client, tools=TOOLS, tool_choice="none", max_tokens=3)
    assert not with_tools.choices[0].message.tool_calls
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens
    assert "tools: get_weather get_time" in _rendered(tool_http, tools=TOOLS)


def test_history_with_tool_calls_and_results_renders(tool_http):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Rome", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
    ]
    text = _rendered(tool_http, messages=history)
    # The arguments reach the template as a mapping (tojson of a dict, not of a string).
    assert '<tool_call>get_weather {"city": "Rome", "days": 1}</tool_call>' in text
    assert "<|im_start|>tool\n22 C and sunny<|im_end|>" in text


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]},
         "tools.0.function.name"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
          "tool_choice": "required"}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]}, "tools"),
        ({"messages": MESSAGES + [{"role": "assistant", "tool_calls": [{
            "id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{not json"}}]}]}, "messages"),
    ],
)
def test_bad_tools_are_400_naming_the_field(tool_client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(tool_client, **kwargs)
    assert info.value.body["param"] == param, info.value.body
    assert _chat(tool_client, max_tokens=2).choices[0].message.content is not None


def test_auto_needs_the_server_flags(client):
    # The shared test server runs without --enable-auto-tool-choice.
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, tools=TOOLS)
    assert info.value.body["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in info.value.body["message"]
    out = _chat(client, tools=TOOLS, tool_choice="required")
    assert _calls(out.choices[0].message)
