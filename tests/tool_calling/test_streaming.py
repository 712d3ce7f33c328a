"""The streamer: however the text is cut into pieces, the deltas add up to the finished
reply's content and calls; each call is announced (id, name) before its arguments."""

from __future__ import annotations

import random

import pytest

from pagedllm.tool_calling import (
    NamedToolOutput,
    RequiredToolOutput,
    ToolCallStreamer,
    get_tool_parser,
)

CASES = [
    ("hermes", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris",'
               ' "days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n'
               "</tool_call>"),
    ("hermes", "Plain answer with a < sign and <tool words."),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}; '
                    '{"name": "now", "parameters": {}}'),
    ("llama3_json", "Rome is warm."),
    ("mistral", 'Ok[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
                '{"name": "now", "arguments": {}}]'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]now[ARGS]{}'),
    ("pythonic", '[get_weather(city="Lima", days=[1, 2]), now()]'),
    ("pythonic", "[1, 2] is not a call."),
]


def _pieces(text: str, seed: int) -> list[str]:
    rng, pieces, pos = random.Random(seed), [], 0
    while pos < len(text):
        size = rng.randint(1, 6)
        pieces.append(text[pos:pos + size])
        pos += size
    return pieces


def _assemble(streamer: ToolCallStreamer, pieces: list[str]):
    content, calls = "", {}
    for number, piece in enumerate(pieces):
        delta = streamer.feed(piece, final=number == len(pieces) - 1)
        content += delta.content
        for part in delta.tool_calls:
            if part.id is not None:
                assert part.index not in calls and part.name, "announced once, with its name"
                calls[part.index] = {"id": part.id, "name": part.name, "arguments": ""}
            assert part.index in calls, "arguments come after the announcement"
            calls[part.index]["arguments"] += part.arguments
    return content, [calls[index] for index in sorted(calls)]


@pytest.mark.parametrize(("name", "text"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stream_adds_up_to_the_finished_reply(name, text, seed):
    parser = get_tool_parser(name)()
    content, calls = parser.extract(text)
    pieces = _pieces(text, seed) + [""]
    streamed_content, streamed_calls = _assemble(ToolCallStreamer(parser), pieces)
    assert streamed_content == (content or "")
    assert [(c["name"], c["arguments"]) for c in streamed_calls] == [
        (c.name, c.arguments) for c in calls]
    assert len({c["id"] for c in streamed_calls}) == len(streamed_calls)


def test_character_by_character():
    parser = get_tool_parser("hermes")()
    text = CASES[0][1]
    content, calls = _assemble(ToolCallStreamer(parser), list(text) + [""])
    assert content == "Checking.\n" and [c["name"] for c in calls] == ["get_weather", "now"]


def test_marker_prefix_is_held_until_settled():
    streamer = ToolCallStreamer(get_tool_parser("hermes")())
    assert streamer.feed("Hi <tool").content == "Hi "
    assert streamer.feed("box>").content == "<toolbox>"


def test_name_is_sent_before_arguments_arrive():
    streamer = ToolCallStreamer(NamedToolOutput("get_weather"))
    first = streamer.feed("")
    assert [(d.index, d.name, d.arguments) for d in first.tool_calls] == [(0, "get_weather", "")]
    assert first.tool_calls[0].id is not None
    assert [d.arguments for d in streamer.feed('{"city": ').tool_calls] == ['{"city": ']
    assert [d.arguments for d in streamer.feed('"Rome"}').tool_calls] == ['"Rome"}']


def test_required_output_streams_each_call():
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    _, calls = _assemble(ToolCallStreamer(RequiredToolOutput()), list(text))
    assert [(c["name"], c["arguments"]) for c in calls] == [("a", '{"x": 1}'), ("b", "{}")]


def test_max_calls_streams_only_the_first():
    text = '[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {}}]'
    _, calls = _assemble(ToolCallStreamer(RequiredToolOutput(), max_calls=1), list(text))
    assert [c["name"] for c in calls] == ["a"]
