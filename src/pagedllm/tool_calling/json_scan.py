"""Finding tool calls in (possibly unfinished) JSON text, without re-serialising it.

A call is an object with a name key and an arguments key. The arguments are kept as the exact
text the model wrote, so the fragments a stream sends add up to the arguments a non-streamed
response returns. Complete values are read with `json`; an unfinished tail is checked with
`partial-json-parser` so that malformed text is told apart from text that is merely cut short.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import partial_json_parser

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


class MalformedToolCall(ValueError):
    """The text cannot become a tool call, however it continues."""


@dataclass
class ToolCallDraft:
    """One tool call as far as the text goes.

    Attributes:
        name: the function's name; None until its string is complete.
        arguments: the arguments' JSON text so far (only ever grows as text arrives).
        complete: True once the call's text is closed.
    """

    name: str | None
    arguments: str
    complete: bool


def skip_whitespace(text: str, pos: int) -> int:
    """The index of the first non-whitespace character at or after `pos`."""
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def _check_prefix(text: str) -> None:
    """Raise MalformedToolCall unless `text` can still become valid JSON."""
    if not text.strip():
        return
    try:
        partial_json_parser.loads(text)
    except Exception as exc:  # the parser raises MalformedJSON, IndexError, ...
        raise MalformedToolCall(f"not JSON: {text[:80]!r}") from exc


def read_value(text: str, pos: int) -> tuple[object, int] | None:
    """The JSON value at `pos` and the index after it; None when the text ends inside it.

    Raises:
        MalformedToolCall: when the text at `pos` is not the start of a JSON value.
    """
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        _check_prefix(text[pos:])
        return None


def read_call(
    text: str, pos: int, name_key: str = "name",
    arguments_keys: tuple[str, ...] = ("arguments", "parameters"),
) -> tuple[ToolCallDraft, int | None]:
    """The call object starting at `pos` (after whitespace) and the index after it.

    Returns the draft and None for the end while the object is unfinished.

    Raises:
        MalformedToolCall: the text is not a call object (or its name/arguments are wrong).
    """
    pos = skip_whitespace(text, pos)
    draft = ToolCallDraft(name=None, arguments="", complete=False)
    if pos >= len(text):
        return draft, None
    if text[pos] != "{":
        raise MalformedToolCall(f"a tool call starts with '{{', got {text[pos:pos + 20]!r}")
    pos += 1
    while True:
        pos = skip_whitespace(text, pos)
        if pos >= len(text):
            return draft, None
        if text[pos] == "}":
            if draft.name is None:
                raise MalformedToolCall("a tool call has no name")
            draft.arguments = draft.arguments or "{}"
            draft.complete = True
            return draft, pos + 1
        if text[pos] == ",":
            pos += 1
            continue
        key = read_value(text, pos)
        if key is None:
            return draft, None
        if not isinstance(key[0], str):
            raise MalformedToolCall("tool call keys are strings")
        pos = skip_whitespace(text, key[1])
        if pos >= len(text):
            return draft, None
        if text[pos] != ":":
            raise MalformedToolCall(f"expected ':' after {key[0]!r}")
        pos = skip_whitespace(text, pos + 1)
        if pos >= len(text):
            return draft, None
        value = read_value(text, pos)
        if value is None:
            if key[0] in arguments_keys:
                draft.arguments = text[pos:]
            return draft, None
        if key[0] == name_key:
            if not isinstance(value[0], str):
                raise MalformedToolCall("a tool call's name is a string")
            draft.name = value[0]
        elif key[0] in arguments_keys:
            if not isinstance(value[0], dict):
                raise MalformedToolCall("a tool call's arguments are an object")
            draft.arguments = text[pos:value[1]]
        pos = value[1]


def read_call_list(
    text: str, pos: int, separator: str = ",", close: str | None = "]",
    arguments_keys: tuple[str, ...] = ("arguments", "parameters"),
) -> tuple[list[ToolCallDraft], int | None]:
    """Calls one after another from `pos` (after an opening '[' when `close` is ']').

    `separator` goes between calls; `close` ends the list (None: the text's end does).
    Returns the drafts and the index after the list (None while it is unfinished).
    """
    drafts: list[ToolCallDraft] = []
    while True:
        draft, end = read_call(text, pos, arguments_keys=arguments_keys)
        if end is None:
            if draft.name is not None or draft.arguments:
                drafts.append(draft)
            return drafts, None
        drafts.append(draft)
        pos = skip_whitespace(text, end)
        if pos >= len(text):
            return drafts, None if close is not None else pos
        if close is not None and text[pos] == close:
            return drafts, pos + 1
        if not text.startswith(separator, pos):
            raise MalformedToolCall(f"expected {separator!r} between tool calls")
        pos += len(separator)
