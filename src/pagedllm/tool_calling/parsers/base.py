"""What every tool-call parser provides, and the registry `--tool-call-parser` names.

A parser reads the model's text (finished, or as far as a stream has got) and splits it into
the content the user sees and the tool calls (ToolCallDraft). One `parse` serves both the full
response and streaming: the streamer (streaming.py) turns successive parses into deltas.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pagedllm.sampling_params import SamplingParams
from pagedllm.tool_calling.json_scan import MalformedToolCall, ToolCallDraft, skip_whitespace


@dataclass
class ToolCall:
    """A finished tool call of a response: `function.arguments` is a JSON object's text."""

    id: str
    name: str
    arguments: str


@dataclass
class ToolParse:
    """The model's text split into content and tool calls."""

    content: str
    calls: list[ToolCallDraft] = field(default_factory=list)


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could be the start of one of `markers`
    (a stream keeps them until it knows whether a tool call begins there)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


class ToolParser(ABC):
    """Splits model output into content and tool calls, for one model family's format.

    Args:
        tokenizer: the model's tokenizer (some formats' markers are special tokens in it).
    """

    name: ClassVar[str]
    # Marker texts that begin a tool section; some tokenizers make them special tokens.
    markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, final: bool) -> ToolParse:
        """`text` as content and calls; malformed tool text is all content.

        Args:
            final: the text is finished (nothing is held back as a possible marker).
        """
        try:
            return self._parse(text, final)
        except MalformedToolCall:
            return ToolParse(content=text)

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The finished `text` as (content, complete calls); content is None when the reply
        is only tool calls (and whitespace)."""
        parse = self.parse(text, final=True)
        calls = [
            ToolCall(self.new_call_id(), draft.name, draft.arguments)
            for draft in parse.calls if draft.complete and draft.name is not None
        ]
        content: str | None = parse.content
        if calls and not parse.content.strip():
            content = None
        return content, calls

    @abstractmethod
    def _parse(self, text: str, final: bool) -> ToolParse:
        """The split; raises MalformedToolCall when the tool text cannot be calls."""

    def settled(self, text: str, final: bool) -> str:
        """`text` without a tail that may still become a marker (all of it when final)."""
        return text if final else text[:len(text) - held_back(text, self.markers)]

    def reply_start(self, text: str) -> int:
        """Where a format that fills the whole reply begins: after leading whitespace and an
        optional first marker (`<|python_tag|>`, `<|python_start|>`)."""
        pos = skip_whitespace(text, 0)
        if self.markers and text.startswith(self.markers[0], pos):
            pos = skip_whitespace(text, pos + len(self.markers[0]))
        return pos

    def reply_as_content(self, text: str, pos: int, final: bool) -> ToolParse:
        """The whole reply as content; while streaming, nothing yet if the text from `pos` may
        still become the first marker."""
        undecided = not final and bool(self.markers) and self.markers[0].startswith(text[pos:])
        return ToolParse(content="" if undecided else text)

    def new_call_id(self) -> str:
        """A fresh tool call id."""
        return f"chatcmpl-tool-{uuid.uuid4().hex}"

    def adjust_params(self, params: SamplingParams) -> None:
        """Keep the markers in the output text when the tokenizer makes them special tokens."""
        special = set(getattr(self.tokenizer, "all_special_tokens", ()) or ())
        added: dict[str, int] = getattr(self.tokenizer, "get_added_vocab", dict)()
        if any(marker in special or marker in added for marker in self.markers):
            params.skip_special_tokens = False


_PARSERS: dict[str, type[ToolParser]] = {}


def register_tool_parser(cls: type[ToolParser]) -> type[ToolParser]:
    """Class decorator: make `cls` available as `--tool-call-parser cls.name`."""
    _PARSERS[cls.name] = cls
    return cls


def tool_parser_names() -> list[str]:
    """The names `--tool-call-parser` accepts."""
    return sorted(_PARSERS)


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class called `name`.

    Raises:
        ValueError: for an unknown name (listing the known ones).
    """
    if name not in _PARSERS:
        raise ValueError(
            f"Unknown tool call parser {name!r}; choose one of {tool_parser_names()}."
        )
    return _PARSERS[name]
