"""Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
after optional content (NousResearch Hermes 2 Pro and 3, Qwen 2.5 and 3)."""

from __future__ import annotations

from pagedllm.tool_calling.json_scan import MalformedToolCall, read_call, skip_whitespace
from pagedllm.tool_calling.parsers.base import ToolParse, ToolParser, register_tool_parser

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@register_tool_parser
class HermesToolParser(ToolParser):
    """`<tool_call>` JSON `</tool_call>`, one block per call; content is the text before."""

    name = "hermes"
    markers = (_OPEN,)

    def _parse(self, text: str, final: bool) -> ToolParse:
        start = text.find(_OPEN)
        if start < 0:
            return ToolParse(content=self.settled(text, final))
        result = ToolParse(content=text[:start])
        pos = start
        while text.startswith(_OPEN, pos):
            body_start = pos + len(_OPEN)
            close = text.find(_CLOSE, body_start)
            body = text[body_start:] if close < 0 else text[body_start:close]
            draft, end = read_call(body, 0)
            tail = "" if end is None else body[end:].strip()
            if close >= 0 and (end is None or tail):
                raise MalformedToolCall("a <tool_call> block holds one call object")
            if close < 0 and tail and not _CLOSE.startswith(tail):
                raise MalformedToolCall("text after a call inside <tool_call>")
            if draft.name is not None or draft.arguments:
                result.calls.append(draft)
            if close < 0:
                break
            pos = skip_whitespace(text, close + len(_CLOSE))
        return result
