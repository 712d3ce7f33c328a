"""Chat messages as chat templates read them, shared by `LLM.chat` and the server.

OpenAI sends an assistant's tool calls with `function.arguments` as a JSON string; templates
(Hermes, Qwen, Llama 3.1, Mistral) loop over the arguments as a mapping, so they are parsed
here, as vLLM does. Everything else passes through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def conversation_for_template(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` with assistant tool-call arguments as dicts.

    Raises:
        ValueError: (naming `messages[i]`) when tool-call arguments are not a JSON object.
    """
    conversation = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be a dict with a 'role' key.")
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                _tool_call_for_template(call, f"messages[{index}].tool_calls[{number}]")
                for number, call in enumerate(message["tool_calls"])
            ]
        conversation.append(message)
    return conversation


def _tool_call_for_template(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise ValueError(f"{where} must be {{'id', 'type': 'function', 'function': {{...}}}}.")
    call = dict(call)
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}.function.arguments is not valid JSON: {exc}") from None
    call["function"] = function
    return call
