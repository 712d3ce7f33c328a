"""Pythonic format (Llama 3.2 / 4, ToolACE): the reply is a Python list of calls,
`[get_weather(city="Paris"), get_time(zone="CET")]`, optionally inside
`<|python_start|>` ... `<|python_end|>`. Arguments are keyword literals, sent as JSON."""

from __future__ import annotations

import ast
import json
import re

from pagedllm.tool_calling.json_scan import MalformedToolCall, ToolCallDraft, skip_whitespace
from pagedllm.tool_calling.parsers.base import ToolParse, ToolParser, register_tool_parser

_START, _END = "<|python_start|>", "<|python_end|>"
_CALL_START = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_NAME_SO_FAR = re.compile(r"[A-Za-z_][\w.]*\s*$")
_OPENERS, _CLOSERS = "([{", ")]}"


@register_tool_parser
class PythonicToolParser(ToolParser):
    """A reply that is a list of Python calls is tool calls; any other reply is content.

    A streamed call's arguments arrive in one piece, when its closing parenthesis does
    (Python literals only become JSON once complete).
    """

    name = "pythonic"
    markers = (_START,)

    def _parse(self, text: str, final: bool) -> ToolParse:
        pos = self.reply_start(text)
        if not text.startswith("[", pos):
            return self.reply_as_content(text, pos, final)
        first = skip_whitespace(text, pos + 1)
        if not _CALL_START.match(text, first):
            could_start = first == len(text) or bool(_NAME_SO_FAR.fullmatch(text, first))
            return ToolParse(content="" if could_start and not final else text)
        calls, end = _read_calls(text, pos + 1)
        if end is not None:
            trailing = text[end:].strip()
            if trailing and not _END.startswith(trailing) and trailing != _END:
                raise MalformedToolCall("text after the list of calls")
        return ToolParse(content="", calls=calls)


def _read_calls(text: str, pos: int) -> tuple[list[ToolCallDraft], int | None]:
    """The calls of the list body at `pos`, and the index after its ']' (None: unfinished)."""
    calls: list[ToolCallDraft] = []
    while True:
        pos = skip_whitespace(text, pos)
        if pos >= len(text):
            return calls, None
        if text[pos] == "]":
            return calls, pos + 1
        if text[pos] == "," and calls:
            pos += 1
            continue
        match = _CALL_START.match(text, pos)
        if match is None:
            if _NAME_SO_FAR.fullmatch(text, pos):
                return calls, None
            raise MalformedToolCall(f"not a call: {text[pos:pos + 30]!r}")
        close = _closing_paren(text, match.end() - 1)
        if close is None:
            calls.append(ToolCallDraft(match.group(1), "", complete=False))
            return calls, None
        arguments = _arguments_json(text[pos:close + 1])
        calls.append(ToolCallDraft(match.group(1), arguments, complete=True))
        pos = close + 1


def _closing_paren(text: str, open_at: int) -> int | None:
    """The index of the ')' closing the '(' at `open_at`, skipping strings and brackets."""
    depth, quote, pos = 0, "", open_at
    while pos < len(text):
        char = text[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in _OPENERS:
            depth += 1
        elif char in _CLOSERS:
            depth -= 1
            if depth == 0:
                return pos
        pos += 1
    return None


def _arguments_json(call_source: str) -> str:
    """The keyword arguments of one call's source, as a JSON object."""
    try:
        call = ast.parse(call_source, mode="eval").body
    except SyntaxError as exc:
        raise MalformedToolCall(f"not a Python call: {call_source[:60]!r}") from exc
    if not isinstance(call, ast.Call) or call.args:
        raise MalformedToolCall("pythonic tool calls take keyword arguments only")
    arguments = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise MalformedToolCall("**kwargs is not a tool call argument")
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError as exc:
            raise MalformedToolCall(f"argument {keyword.arg!r} is not a literal") from exc
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except TypeError as exc:  # sets, bytes, complex numbers: not JSON
        raise MalformedToolCall(f"arguments are not JSON values: {exc}") from exc
