"""Reading the output of a forced tool choice, whose shape the grammar fixed
(tools.py builds the grammars): a named function's arguments object, or for
`tool_choice="required"` a JSON list of `{"name", "parameters"}`."""

from __future__ import annotations

from pagedllm.tool_calling.json_scan import (
    MalformedToolCall,
    ToolCallDraft,
    read_call_list,
    read_value,
    skip_whitespace,
)
from pagedllm.tool_calling.parsers.base import ToolParse, ToolParser


class NamedToolOutput(ToolParser):
    """`tool_choice={"type": "function", "function": {"name": ...}}`: the output is the
    arguments; the call is announced (with its name) before any of them arrive."""

    name = "named"

    def __init__(self, function_name: str, tokenizer: object = None) -> None:
        super().__init__(tokenizer)
        self.function_name = function_name

    def _parse(self, text: str, final: bool) -> ToolParse:
        pos = skip_whitespace(text, 0)
        value = read_value(text, pos) if pos < len(text) else None
        if value is None:
            return ToolParse("", [ToolCallDraft(self.function_name, text[pos:], False)])
        return ToolParse("", [ToolCallDraft(self.function_name, text[pos:value[1]], True)])


class RequiredToolOutput(ToolParser):
    """`tool_choice="required"`: a JSON list of `{"name": ..., "parameters": {...}}`."""

    name = "required"

    def _parse(self, text: str, final: bool) -> ToolParse:
        pos = skip_whitespace(text, 0)
        if pos >= len(text):
            return ToolParse("")
        if text[pos] != "[":
            raise MalformedToolCall("tool_choice='required' output is a JSON list")
        calls, _ = read_call_list(text, pos + 1, close="]", arguments_keys=("parameters",))
        return ToolParse("", calls)
