"""The reasoning parsers: a reply split into reasoning and answer, whole or streamed in any
chunking (the deltas add up to the whole split; no delta carries part of a tag)."""

from __future__ import annotations

import random

import pytest

from pagedllm.reasoning import get_reasoning_parser, reasoning_parser_names

CASES = [
    # (parser, reply, reasoning, answer)
    ("deepseek_r1", "<think>Let me see.</think>Paris.", "Let me see.", "Paris."),
    ("deepseek_r1", "Let me see.</think>Paris.", "Let me see.", "Paris."),  # opened in prompt
    ("deepseek_r1", "Still thinking when cut", "Still thinking when cut", None),
    ("deepseek_r1", "</think>Just the answer", None, "Just the answer"),
    ("qwen3", "<think>\nhm\n</think>\n\nParis.", "\nhm\n", "\n\nParis."),
    ("qwen3", "Paris, with no thinking.", None, "Paris, with no thinking."),
    ("qwen3", "\n<think>a</think>b", "a", "b"),
    ("qwen3", "<thin", None, "<thin"),  # a tag's start that never completes is answer text
]


@pytest.mark.parametrize(("name", "reply", "reasoning", "answer"), CASES)
def test_whole_reply(name, reply, reasoning, answer):
    split = get_reasoning_parser(name).split(reply)
    assert (split.reasoning, split.content) == (reasoning, answer)


@pytest.mark.parametrize(("name", "reply", "reasoning", "answer"), CASES)
def test_any_chunking_streams_the_same_split(name, reply, reasoning, answer):
    from pagedllm.reasoning import ReasoningStreamer

    rng = random.Random(len(reply))
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(reply)), k=min(len(reply) - 1, rng.randint(0, 6))))
        pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
        streamer = ReasoningStreamer(get_reasoning_parser(name))
        got_reasoning, got_answer = "", ""
        for index, piece in enumerate(pieces):
            split = streamer.feed(piece, final=index == len(pieces) - 1)
            for part in (split.reasoning or "", split.content or ""):
                assert "<think>" not in part and "</think>" not in part
            got_reasoning += split.reasoning or ""
            got_answer += split.content or ""
        assert (got_reasoning or None, got_answer or None) == (reasoning, answer), pieces


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        get_reasoning_parser("nope")
    assert reasoning_parser_names() == ["deepseek_r1", "qwen3"]
