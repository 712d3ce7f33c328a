"""Llama 3.1 / 3.2 JSON format: the whole reply is `{"name": ..., "parameters": {...}}`
(optionally after `<|python_tag|>`), several calls separated by `;`."""

from __future__ import annotations

from pagedllm.tool_calling.json_scan import read_call_list, skip_whitespace
from pagedllm.tool_calling.parsers.base import ToolParse, ToolParser, register_tool_parser

_PYTHON_TAG = "<|python_tag|>"


@register_tool_parser
class Llama3JsonToolParser(ToolParser):
    """A reply that starts with a JSON object is tool calls; any other reply is content."""

    name = "llama3_json"
    markers = (_PYTHON_TAG,)

    def _parse(self, text: str, final: bool) -> ToolParse:
        pos = skip_whitespace(text, 0)
        if text.startswith(_PYTHON_TAG, pos):
            pos = skip_whitespace(text, pos + len(_PYTHON_TAG))
        if pos >= len(text):
            return ToolParse(content=text if final else "")
        if text[pos] != "{":
            if not final and _PYTHON_TAG.startswith(text[pos:]):
                return ToolParse(content="")
            return ToolParse(content=text)
        calls, _ = read_call_list(text, pos, separator=";", close=None)
        return ToolParse(content="", calls=calls)
