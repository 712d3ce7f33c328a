"""Each tool-call parser on finished replies: content and calls split as its model family
writes them; malformed or absent tool text stays content."""

from __future__ import annotations

import json

import pytest

from pagedllm.tool_calling import NamedToolOutput, RequiredToolOutput, get_tool_parser
from pagedllm.tool_calling.parsers.base import held_back

WEATHER = {"city": "Paris", "days": [1, 2], "unit": None, "nested": {"a": "}]"}}
WEATHER_JSON = json.dumps(WEATHER)


def _calls(parser, text):
    content, calls = parser.extract(text)
    return content, [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize(
    ("name", "text", "content", "calls"),
    [
        ("hermes", f'Let me look.\n<tool_call>\n{{"name": "get_weather", "arguments": '
                   f'{WEATHER_JSON}}}\n</tool_call>\n<tool_call>{{"name": "now", "arguments": '
                   f'{{}}}}</tool_call>',
         "Let me look.\n", [("get_weather", WEATHER), ("now", {})]),
        ("hermes", "No tools needed.", "No tools needed.", []),
        ("llama3_json", f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER_JSON}}}'
                        '; {"name": "now", "parameters": {}}',
         None, [("get_weather", WEATHER), ("now", {})]),
        ("llama3_json", f'{{"name": "get_weather", "arguments": {WEATHER_JSON}}}', None,
         [("get_weather", WEATHER)]),
        ("llama3_json", "Paris is sunny.", "Paris is sunny.", []),
        ("mistral", f'Sure.[TOOL_CALLS] [{{"name": "get_weather", "arguments": {WEATHER_JSON}}},'
                    ' {"name": "now", "arguments": {}}]',
         "Sure.", [("get_weather", WEATHER), ("now", {})]),
        ("mistral", f'[TOOL_CALLS]get_weather[ARGS]{WEATHER_JSON}[TOOL_CALLS]now[ARGS]{{}}',
         None, [("get_weather", WEATHER), ("now", {})]),
        ("pythonic", '[get_weather(city="Paris", days=[1, 2], unit=None, nested={"a": "}]"}), '
                     "now()]", None, [("get_weather", WEATHER), ("now", {})]),
        ("pythonic", '<|python_start|>[now()]<|python_end|>', None, [("now", {})]),
        ("pythonic", "[1, 2, 3] is a list.", "[1, 2, 3] is a list.", []),
    ],
)
def test_parser_splits_content_and_calls(name, text, content, calls):
    assert _calls(get_tool_parser(name)(), text) == (content, calls)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),
        ("hermes", "<tool_call>not json</tool_call>"),
        ("llama3_json", '{"name": "f", "parameters": {}} and then text'),
        ("mistral", '[TOOL_CALLS][{"name": 3, "arguments": {}}]'),
        ("pythonic", "[f(1, 2)]"),
        ("pythonic", "[f(x=open('file'))]"),
    ],
)
def test_malformed_tool_text_is_content(name, text):
    assert get_tool_parser(name)().extract(text) == (text, [])


def test_unfinished_call_is_dropped_from_a_finished_reply():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "ar'
    content, calls = get_tool_parser("hermes")().extract(text)
    assert content is None and [call.name for call in calls] == ["a"]


def test_arguments_are_the_models_own_text():
    # Whitespace and key order as written: the stream's fragments add up to the same text.
    text = '<tool_call>{"name": "f", "arguments": {"b":1,  "a": "x"}}</tool_call>'
    _, calls = get_tool_parser("hermes")().extract(text)
    assert calls[0].arguments == '{"b":1,  "a": "x"}'


def test_forced_outputs():
    _, calls = NamedToolOutput("get_weather").extract(f" {WEATHER_JSON}")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", WEATHER)]
    text = f'[{{"name": "get_weather", "parameters": {WEATHER_JSON}}}, ' \
           '{"name": "now", "parameters": {}}]'
    _, calls = RequiredToolOutput().extract(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", WEATHER), ("now", {})]


def test_call_ids():
    hermes, mistral = get_tool_parser("hermes")(), get_tool_parser("mistral")()
    assert hermes.new_call_id().startswith("chatcmpl-tool-")
    assert hermes.new_call_id() != hermes.new_call_id()
    mistral_id = mistral.new_call_id()
    assert len(mistral_id) == 9 and mistral_id.isalnum()


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="hermes.*llama3_json.*mistral.*pythonic"):
        get_tool_parser("nope")


def test_held_back_is_the_longest_marker_prefix():
    assert held_back("Sure <tool_ca", ("<tool_call>",)) == 8
    assert held_back("Sure <", ("<tool_call>",)) == 1
    assert held_back("Sure", ("<tool_call>",)) == 0


class _SpecialMarkerTokenizer:
    all_special_tokens = ["<|im_end|>"]

    def get_added_vocab(self):
        return {"<tool_call>": 5, "</tool_call>": 6}


def test_markers_that_are_special_tokens_stay_in_the_text():
    from pagedllm import SamplingParams

    params = SamplingParams()
    get_tool_parser("hermes")(_SpecialMarkerTokenizer()).adjust_params(params)
    assert params.skip_special_tokens is False
    params = SamplingParams()
    get_tool_parser("mistral")(_SpecialMarkerTokenizer()).adjust_params(params)
    assert params.skip_special_tokens is True
