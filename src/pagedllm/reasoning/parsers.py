"""The reasoning parsers and the streamer that applies them.

A reply is read left to right in one of three states: not yet decided, inside the
reasoning, in the answer. The parsers differ only in where the reasoning may start:

- `deepseek_r1`: the reply starts inside the reasoning (DeepSeek-R1's template opens
  `<think>` in the prompt; a leading `<think>` in the reply is dropped too) and it ends at
  `</think>`;
- `qwen3`: the reply has reasoning only when it opens with `<think>` (Qwen3 writes the tag
  itself; with `enable_thinking: false` its template closes an empty block in the prompt, and
  the whole reply is the answer).

A reply that never closes its reasoning (cut by max_tokens) is all reasoning. A tag split
across stream deltas is held back until it is whole, so no delta carries part of a tag.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningParser:
    """Where a model's reasoning starts and ends in its reply.

    Attributes:
        name: the `--reasoning-parser` name.
        starts_inside: the reply begins inside the reasoning (no opening tag needed).
        start_tag / end_tag: the tags around the reasoning.
    """

    name: str
    starts_inside: bool
    start_tag: str = "<think>"
    end_tag: str = "</think>"

    def split(self, text: str) -> ReasoningSplit:
        """A whole reply's reasoning and answer."""
        streamer = ReasoningStreamer(self)
        return streamer.feed(text, final=True)


@dataclass
class ReasoningSplit:
    """Reasoning and answer text (a whole reply's, or one delta's); None: none."""

    reasoning: str | None = None
    content: str | None = None


_START, _REASONING, _CONTENT = "start", "reasoning", "content"


class ReasoningStreamer:
    """Splits one choice's reply, fed as deltas, into reasoning and answer deltas."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.state = _START
        self.pending = ""  # text held back: it may be the start of a tag

    def feed(self, delta: str, final: bool = False) -> ReasoningSplit:
        """The reasoning and answer text `delta` completes (`final`: the reply ended)."""
        self.pending += delta
        reasoning, content = [], []
        if self.state == _START:
            self._decide(final)
        if self.state == _REASONING:
            reasoning.append(self._take_reasoning(final))
        if self.state == _CONTENT:
            content.append(self.pending)
            self.pending = ""
        return ReasoningSplit("".join(reasoning) or None, "".join(content) or None)

    def _decide(self, final: bool) -> None:
        """Opening tag or not: wait while the text so far could still become one."""
        tag = self.parser.start_tag
        text = self.pending.lstrip()
        if text.startswith(tag):
            self.pending = text[len(tag):]
            self.state = _REASONING
        elif tag.startswith(text) and not final:
            return  # too short to tell
        else:
            self.state = _REASONING if self.parser.starts_inside else _CONTENT

    def _take_reasoning(self, final: bool) -> str:
        """The reasoning text that is certain; moves on to the answer at the closing tag."""
        tag = self.parser.end_tag
        index = self.pending.find(tag)
        if index >= 0:
            reasoning = self.pending[:index]
            self.pending = self.pending[index + len(tag):]
            self.state = _CONTENT
            return reasoning
        keep = 0 if final else _partial_tag_length(self.pending, tag)
        reasoning = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return reasoning


def _partial_tag_length(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


_PARSERS = {
    parser.name: parser
    for parser in (ReasoningParser("deepseek_r1", starts_inside=True),
                   ReasoningParser("qwen3", starts_inside=False))
}


def reasoning_parser_names() -> list[str]:
    """The names `--reasoning-parser` takes."""
    return sorted(_PARSERS)


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser called `name`; ValueError naming the known ones otherwise."""
    try:
        return _PARSERS[name]
    except KeyError:
        raise ValueError(f"Unknown reasoning parser {name!r}; choose one of "
                         f"{', '.join(reasoning_parser_names())}.") from None
