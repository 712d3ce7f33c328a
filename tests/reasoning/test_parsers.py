"""The reasoning parsers: a reply split into reasoning and answer, whole or streamed in any
chunking (the deltas add up to the whole split; no delta carries part of a marker). The
cases follow the formats vLLM's parsers read (their test vectors' shapes)."""

from __future__ import annotations

import random

import pytest

from pagedllm.reasoning import get_reasoning_parser, reasoning_parser_names

G_START, G_END = "Here is my thought process:", "Here is my response:"
H_START, H_END, H_ANSWER_END = "<think>\n", "\n</think>\n<answer>\n", "\n</answer>"
R = "<|channel|>analysis<|message|>"
F = "<|end|><|start|>assistant<|channel|>final<|message|>"

CASES = [
    # (parser, reply, reasoning, answer)
    ("deepseek_r1", "<think>Let me see.</think>Paris.", "Let me see.", "Paris."),
    ("deepseek_r1", "Let me see.</think>Paris.", "Let me see.", "Paris."),  # opened in prompt
    ("deepseek_r1", "Still thinking when cut", "Still thinking when cut", None),
    ("deepseek_r1", "</think>Just the answer", None, "Just the answer"),
    ("qwen3", "<think>\nhm\n</think>\n\nParis.", "\nhm\n", "\n\nParis."),
    ("qwen3", "Paris, with no thinking.", None, "Paris, with no thinking."),
    ("qwen3", "\n<think>a</think>b", "a", "b"),
    ("qwen3", "<thin", None, "<thin"),  # a marker's start that never completes is answer text
    ("granite", f"{G_START}This is a reasoning section{G_END}This is the rest",
     "This is a reasoning section", "This is the rest"),
    ("granite", f"{G_START}This\nThat{G_END}This is the rest\nThat", "This\nThat",
     "This is the rest\nThat"),
    ("granite", "Here's my thought process: foo Here's my response: bar", " foo ", " bar"),
    ("granite", f"{G_START}This is a reasoning section{G_END}", "This is a reasoning section",
     None),
    ("granite", "This is content", None, "This is content"),
    ("granite", "Here is my thought failure", None, "Here is my thought failure"),
    ("hunyuan_a13b", f"{H_START}This is a reasoning section{H_END}This is the rest"
     f"{H_ANSWER_END}", "This is a reasoning section", "This is the rest"),
    ("hunyuan_a13b", f"{H_START}{H_END}This is the rest{H_ANSWER_END}", None,
     "This is the rest"),
    ("hunyuan_a13b", f"{H_START}This\nThat{H_END}This is the rest\nThat", "This\nThat",
     "This is the rest\nThat"),
    ("hunyuan_a13b", "This is content", None, "This is content"),
    ("mistral", "[THINK]This\nThat[/THINK]This is the rest\nThat", "This\nThat",
     "This is the rest\nThat"),
    ("mistral", "[THINK]This is reasoning", "This is reasoning", None),
    ("mistral", "This is content", None, "This is content"),
    ("openai_gptoss", f"{R}This is reasoning{F}This is the rest<|return|>",
     "This is reasoning", "This is the rest"),
    ("openai_gptoss", f"{R}Still reasoning when cut", "Still reasoning when cut", None),
    # A tool call (a recipient) is neither; a preamble (commentary, no recipient) is answer.
    ("gpt_oss", f"{R}plan<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
     "plan", None),
    ("gpt_oss", f"{R}a<|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
     f"<|end|><|start|>assistant<|channel|>analysis<|message|>b{F}Done.<|return|>",
     "a\nb", "Checking.\nDone."),
    ("gpt_oss", "plain text, no channels", None, "plain text, no channels"),
]

_MARKERS = ("<think>", "</think>", "[THINK]", "[/THINK]", "<|message|>", "<|end|>",
            "</answer>", G_START, G_END)


@pytest.mark.parametrize(("name", "reply", "reasoning", "answer"), CASES)
def test_whole_reply(name, reply, reasoning, answer):
    split = get_reasoning_parser(name).split(reply)
    assert (split.reasoning, split.content) == (reasoning, answer)


@pytest.mark.parametrize(("name", "reply", "reasoning", "answer"), CASES)
def test_any_chunking_streams_the_same_split(name, reply, reasoning, answer):
    rng = random.Random(len(reply))
    parser = get_reasoning_parser(name)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(reply)), k=min(len(reply) - 1, rng.randint(0, 6))))
        pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
        streamer = parser.streamer()
        got_reasoning, got_answer = "", ""
        for index, piece in enumerate(pieces):
            split = streamer.feed(piece, final=index == len(pieces) - 1)
            expected = (reasoning or "") + (answer or "")
            for part in (split.reasoning or "", split.content or ""):
                # No delta carries a marker (or a marker's end: held back until whole).
                assert not any(m in part for m in _MARKERS if m not in expected), pieces
            got_reasoning += split.reasoning or ""
            got_answer += split.content or ""
        assert (got_reasoning or None, got_answer or None) == (reasoning, answer), pieces


@pytest.mark.parametrize(("name", "prompt_end", "ended"), [
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", True),  # enable_thinking off
    ("qwen3", "<|im_start|>assistant\n", False),
    ("deepseek_r1", "<｜Assistant｜><think>\n", False),
    ("deepseek_r1", "<think>a</think> b <think>\n", False),
    ("granite", f"{G_START} x {G_END}", True),
    # A system prompt quoting the markers (Granite 3.2's does) leaves the reply to reason.
    ("granite", f"Write after '{G_START}' and then after '{G_END}'.\nUser: hi\nAssistant:",
     False),
    ("qwen3", "<think>old</think>answer<|im_end|>\n<|im_start|>assistant\n", False),
    ("gpt_oss", "<|start|>assistant", False),
    ("gpt_oss", "<|start|>assistant<|channel|>final<|message|>", True),
])
def test_prompt_that_closed_the_reasoning_makes_the_reply_all_answer(name, prompt_end, ended):
    parser = get_reasoning_parser(name)
    assert parser.ended_in(prompt_end) is ended
    split = parser.split("<think>x</think>y" if name != "gpt_oss" else f"{R}x{F}y",
                         answer_from_start=True)
    assert split.reasoning is None and split.content is not None


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="deepseek_r1, gpt_oss, granite"):
        get_reasoning_parser("nope")
    assert reasoning_parser_names() == ["deepseek_r1", "gpt_oss", "granite", "hunyuan_a13b",
                                        "mistral", "openai_gptoss", "qwen3"]
