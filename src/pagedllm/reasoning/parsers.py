"""Reasoning parsers: where a model's reasoning starts and ends in its reply.

Every parser reads a reply left to right, as whole text or as stream deltas, through a
streamer in one of three states: not yet decided, inside the reasoning, in the answer. A
marker split across deltas is held back until it is whole, so no delta carries part of one.
A reply that never closes its reasoning (cut by max_tokens) is all reasoning. When the prompt
already closed the reasoning (Qwen3's `enable_thinking: false` template writes an empty
`<think></think>`), the whole reply is the answer (`answer_from_start`).

The tag parsers differ in their markers and in where the reasoning may start:

- `deepseek_r1`: the reply starts inside the reasoning (DeepSeek-R1's template opens
  `<think>` in the prompt; a leading `<think>` in the reply is dropped too); `</think>` ends it;
- `qwen3`: the reply has reasoning only when it opens with `<think>`;
- `granite`: "Here is my thought process:" (or "Here's ...") opens it and "Here is my
  response:" (or "Here's ...") ends it (Granite 3.2's plain-text markers);
- `hunyuan_a13b`: "<think>\\n" opens it, "\\n</think>\\n<answer>\\n" ends it, and the answer
  ends at "\\n</answer>" (dropped, with anything after it);
- `mistral`: `[THINK]` … `[/THINK]` (Magistral's control tokens: the server keeps special
  tokens in the text of such requests so the markers can be seen).

`openai_gptoss` (alias `gpt_oss`), OpenAI's harmony channels, is in harmony.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol


@dataclass
class ReasoningSplit:
    """Reasoning and answer text (a whole reply's, or one delta's); None: none."""

    reasoning: str | None = None
    content: str | None = None


class ReplyStreamer(Protocol):
    """Splits one reply, fed as text deltas, into reasoning and answer deltas."""

    @property
    def in_answer(self) -> bool:
        """True once the text fed so far has reached the answer."""

    def feed(self, delta: str, final: bool = False) -> ReasoningSplit:
        """The reasoning and answer text `delta` completes (`final`: the reply ended)."""


class ReasoningParser(ABC):
    """A `--reasoning-parser`: makes the streamers of replies and reads prompts."""

    name: str
    # The markers are special tokens: requests must keep special tokens in their text.
    needs_special_tokens: bool = False

    @abstractmethod
    def streamer(self, answer_from_start: bool = False) -> ReplyStreamer:
        """A streamer for one reply (`answer_from_start`: the prompt closed the reasoning)."""

    @abstractmethod
    def ended_in(self, prompt_text: str) -> bool:
        """True when `prompt_text` already closed the reasoning (the reply is the answer)."""

    def split(self, text: str, answer_from_start: bool = False) -> ReasoningSplit:
        """A whole reply's reasoning and answer."""
        return self.streamer(answer_from_start).feed(text, final=True)

    def split_reply(self, prompt_text: str | None, text: str) -> ReasoningSplit:
        """The reasoning and answer of a reply to `prompt_text` (a prompt that closed the
        reasoning makes it all answer)."""
        return self.split(text, answer_from_start=self.ended_in(prompt_text or ""))

    def reply_streamer(self, prompt_text: str | None) -> ReplyStreamer:
        """A streamer for a reply to `prompt_text`."""
        return self.streamer(answer_from_start=self.ended_in(prompt_text or ""))


_START, _REASONING, _CONTENT, _DONE = "start", "reasoning", "content", "done"


@dataclass(frozen=True)
class TagReasoningParser(ReasoningParser):
    """A parser whose reasoning sits between text markers.

    Attributes:
        name: the `--reasoning-parser` name.
        starts_inside: the reply begins inside the reasoning (no opening marker needed).
        start_tags / end_tags: the markers around the reasoning (any of each).
        answer_end_tag: where the answer ends (dropped with what follows); None: at the end.
        needs_special_tokens: the markers are special tokens.
    """

    name: str
    starts_inside: bool
    start_tags: tuple[str, ...] = ("<think>",)
    end_tags: tuple[str, ...] = ("</think>",)
    answer_end_tag: str | None = None
    needs_special_tokens: bool = False

    def streamer(self, answer_from_start: bool = False) -> TagStreamer:
        """A streamer for one reply."""
        return TagStreamer(self, answer_from_start)

    def ended_in(self, prompt_text: str) -> bool:
        """The prompt ends with an end marker (a template that closed the reasoning, as
        Qwen3's with `enable_thinking: false`); markers earlier in the prompt (a system
        prompt quoting them, earlier turns) do not count."""
        tail = prompt_text.rstrip()
        return any(tail.endswith(tag.rstrip()) for tag in self.end_tags)


@dataclass
class TagStreamer:
    """Splits one reply under a TagReasoningParser (see the module docstring)."""

    parser: TagReasoningParser
    answer_from_start: bool = False
    state: str = _START
    pending: str = ""  # text held back: it may be the start of a marker

    def __post_init__(self) -> None:
        if self.answer_from_start:
            self.state = _CONTENT

    @property
    def in_answer(self) -> bool:
        """True once the reply reached its answer."""
        return self.state in (_CONTENT, _DONE)

    def feed(self, delta: str, final: bool = False) -> ReasoningSplit:
        """The reasoning and answer text `delta` completes (`final`: the reply ended)."""
        self.pending += delta
        reasoning, content = "", ""
        if self.state == _START:
            self._decide(final)
        if self.state == _REASONING:
            reasoning = self._take_reasoning(final)
        if self.state == _CONTENT:
            content = self._take_content(final)
        if self.state == _DONE:
            self.pending = ""
        return ReasoningSplit(reasoning or None, content or None)

    def _decide(self, final: bool) -> None:
        """Opening marker or not: wait while the text so far could still become one."""
        text = self.pending.lstrip()
        for tag in self.parser.start_tags:
            if text.startswith(tag):
                self.pending = text[len(tag):]
                self.state = _REASONING
                return
        if not final and any(tag.startswith(text) for tag in self.parser.start_tags):
            return  # too short to tell
        self.state = _REASONING if self.parser.starts_inside else _CONTENT

    def _take_reasoning(self, final: bool) -> str:
        """The reasoning that is certain; moves on to the answer at the end marker."""
        found = _first_tag(self.pending, self.parser.end_tags)
        if found is not None:
            index, tag = found
            reasoning = self.pending[:index]
            self.pending = self.pending[index + len(tag):]
            self.state = _CONTENT
            return reasoning
        return self._release(final, self.parser.end_tags)

    def _take_content(self, final: bool) -> str:
        """The answer that is certain; stops at the answer's end marker (if the parser has
        one)."""
        tag = self.parser.answer_end_tag
        if tag is None:
            content, self.pending = self.pending, ""
            return content
        index = self.pending.find(tag)
        if index >= 0:
            content = self.pending[:index]
            self.pending, self.state = "", _DONE
            return content
        return self._release(final, (tag,))

    def _release(self, final: bool, tags: tuple[str, ...]) -> str:
        """The pending text but a tail that may begin one of `tags` (all of it if final)."""
        keep = 0 if final else max(_partial_tag_length(self.pending, tag) for tag in tags)
        released = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return released


def _first_tag(text: str, tags: tuple[str, ...]) -> tuple[int, str] | None:
    """The earliest of `tags` in `text` (its index and which), or None."""
    hits = [(text.find(tag), tag) for tag in tags if tag in text]
    return min(hits) if hits else None


def _partial_tag_length(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


TAG_PARSERS = (
    TagReasoningParser("deepseek_r1", starts_inside=True),
    TagReasoningParser("qwen3", starts_inside=False),
    TagReasoningParser(
        "granite", starts_inside=False,
        start_tags=("Here is my thought process:", "Here's my thought process:"),
        end_tags=("Here is my response:", "Here's my response:"),
    ),
    TagReasoningParser(
        "hunyuan_a13b", starts_inside=False, start_tags=("<think>\n",),
        end_tags=("\n</think>\n<answer>\n", "</think>\n<answer>\n"),
        answer_end_tag="\n</answer>",
    ),
    TagReasoningParser("mistral", starts_inside=False, start_tags=("[THINK]",),
                       end_tags=("[/THINK]",), needs_special_tokens=True),
)
