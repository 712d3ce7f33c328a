"""Streaming tool calls: successive parses of the growing text → OpenAI-style deltas.

Each call is announced once (index, id, name, empty arguments), then its arguments follow as
fragments that add up to the arguments of the non-streamed response. Content is sent as it
settles (a possible marker at the end waits for the next piece).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedllm.tool_calling.parsers.base import ToolParser


@dataclass
class ToolCallDelta:
    """One piece of one tool call: its announcement (id and name) or an argument fragment."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass
class StreamDelta:
    """What one step of the stream adds: content, then tool call pieces in order."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


class ToolCallStreamer:
    """Turns the text of one streamed choice into content and tool-call deltas.

    Args:
        max_calls: stream at most this many calls (None: all).
    """

    def __init__(self, parser: ToolParser, max_calls: int | None = None) -> None:
        self.parser = parser
        self.max_calls = max_calls
        self._text = ""
        self._content_sent = ""
        self._ids: list[str] = []
        self._arguments_sent: list[str] = []

    @property
    def called_tools(self) -> bool:
        """Whether any tool call has been announced."""
        return bool(self._ids)

    def feed(self, delta_text: str, final: bool = False) -> StreamDelta:
        """Add `delta_text` (`final`: the text is finished) and return what is new."""
        self._text += delta_text
        parse = self.parser.parse(self._text, final)
        delta = StreamDelta()
        if parse.content.startswith(self._content_sent):
            delta.content = parse.content[len(self._content_sent):]
            self._content_sent = parse.content
        for index, draft in enumerate(parse.calls[:self.max_calls]):
            if draft.name is None:
                break  # calls are announced in order, each once its name is known
            if index == len(self._ids):
                self._ids.append(self.parser.new_call_id())
                self._arguments_sent.append("")
                delta.tool_calls.append(ToolCallDelta(index, "", self._ids[index], draft.name))
            sent = self._arguments_sent[index]
            if len(draft.arguments) > len(sent) and draft.arguments.startswith(sent):
                delta.tool_calls.append(ToolCallDelta(index, draft.arguments[len(sent):]))
                self._arguments_sent[index] = draft.arguments
        return delta
