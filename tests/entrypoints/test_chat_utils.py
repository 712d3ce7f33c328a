"""Chat messages for templates: tool-call arguments become mappings; the example Hermes
template renders tools, an assistant's tool calls and tool results as the parser reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from pagedllm.entrypoints.chat_utils import conversation_for_template
from pagedllm.tokenizer.tokenizer import apply_chat_template
from pagedllm.tool_calling import get_tool_parser

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}


def test_arguments_become_a_mapping_and_the_input_is_not_changed():
    messages = [{"role": "assistant", "content": None, "tool_calls": [CALL]}]
    conversation = conversation_for_template(messages)
    assert conversation[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Rome"}
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'


def test_bad_arguments_name_the_message():
    call = {**CALL, "function": {"name": "f", "arguments": "[1,"}}
    with pytest.raises(ValueError, match=r"messages\[0\].tool_calls\[0\].function.arguments"):
        conversation_for_template([{"role": "assistant", "tool_calls": [call]}])


def test_example_hermes_template_round_trips_through_the_parser(tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    template = (REPO / "examples" / "tool_chat_template_hermes.jinja").read_text()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
    ]
    text = apply_chat_template(tokenizer, conversation_for_template(messages), True, template,
                               tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n")
    assert '"name": "get_weather", "description": "The weather of a city."' in text
    assert "<tool_response>\n22 C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # The assistant turn is written in the format the hermes parser reads.
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    _, calls = get_tool_parser("hermes")().extract(turn)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Rome"}')]
