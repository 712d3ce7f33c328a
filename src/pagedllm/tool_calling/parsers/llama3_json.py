"""Llama 3.1 / 3.2 JSON format: the whole reply is `{"name": ..., "parameters": {...}}`
(optionally after `<|python_tag|>`), several calls separated by `;`."""

from __future__ import annotations

from pagedllm.tool_calling.json_scan import read_call_list
from pagedllm.tool_calling.parsers.base import ToolParse, ToolParser, register_tool_parser

_PYTHON_TAG = "<|python_tag|>"


@register_tool_parser
class Llama3JsonToolParser(ToolParser):
    """A reply that starts with a JSON object is tool calls; any other reply is content."""

    name = "llama3_json"
    markers = (_PYTHON_TAG,)

    def _parse(self, text: str, final: bool) -> ToolParse:
        pos = self.reply_start(text)
        if not text.startswith("{", pos):
            return self.reply_as_content(text, pos, final)
        calls, _ = read_call_list(text, pos, separator=";", close=None)
        return ToolParse(content="", calls=calls)
