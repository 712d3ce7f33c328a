"""Mistral format: content, then `[TOOL_CALLS]` and a JSON list of `{"name", "arguments"}`
(tokenizer v3-v7), or `[TOOL_CALLS]name[ARGS]{...}` per call (v11 and later)."""

from __future__ import annotations

import random
import string

from pagedllm.tool_calling.json_scan import (
    MalformedToolCall,
    ToolCallDraft,
    read_call_list,
    read_value,
    skip_whitespace,
)
from pagedllm.tool_calling.parsers.base import ToolParse, ToolParser, register_tool_parser

_TOOL_CALLS, _ARGS = "[TOOL_CALLS]", "[ARGS]"
_ID_CHARS = string.ascii_letters + string.digits


@register_tool_parser
class MistralToolParser(ToolParser):
    """`[TOOL_CALLS]` then the calls; Mistral's templates want 9-character call ids."""

    name = "mistral"
    markers = (_TOOL_CALLS,)

    def new_call_id(self) -> str:
        """Nine letters and digits, the only id shape Mistral's chat templates accept."""
        return "".join(random.choices(_ID_CHARS, k=9))

    def _parse(self, text: str, final: bool) -> ToolParse:
        start = text.find(_TOOL_CALLS)
        if start < 0:
            return ToolParse(content=self.settled(text, final))
        pos = skip_whitespace(text, start + len(_TOOL_CALLS))
        if pos >= len(text):
            return ToolParse(content=text[:start])
        if text[pos] == "[":
            calls, _ = read_call_list(text, pos + 1, close="]", arguments_keys=("arguments",))
        else:
            calls = _named_calls(text, pos)
        return ToolParse(content=text[:start], calls=calls)


def _named_calls(text: str, pos: int) -> list[ToolCallDraft]:
    """`name[ARGS]{...}` calls, each after its own [TOOL_CALLS]."""
    calls: list[ToolCallDraft] = []
    while True:
        args_at = text.find(_ARGS, pos)
        if args_at < 0:
            return calls  # the name is still arriving
        name = text[pos:args_at].strip()
        if not name.isidentifier() and not name.replace("-", "_").replace(".", "_").isidentifier():
            raise MalformedToolCall(f"not a function name: {name!r}")
        value_at = skip_whitespace(text, args_at + len(_ARGS))
        value = read_value(text, value_at) if value_at < len(text) else None
        if value is None:
            calls.append(ToolCallDraft(name, text[value_at:], complete=False))
            return calls
        if not isinstance(value[0], dict):
            raise MalformedToolCall("a tool call's arguments are an object")
        calls.append(ToolCallDraft(name, text[value_at:value[1]], complete=True))
        pos = skip_whitespace(text, value[1])
        if not text.startswith(_TOOL_CALLS, pos):
            return calls
        pos += len(_TOOL_CALLS)
