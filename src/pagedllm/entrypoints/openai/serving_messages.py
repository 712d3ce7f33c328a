"""POST /v1/messages (Anthropic's Messages API, which vLLM serves), on top of chat.

An Anthropic request becomes a chat completion: `system` a system message, each message's
text blocks its content, `tool_use` blocks assistant tool calls and `tool_result` blocks tool
messages; `tools` (`input_schema`), `tool_choice` (auto / any / tool / none),
`stop_sequences`, `max_tokens`, `temperature`, `top_p`, `top_k` map to their chat fields. The
chat handler answers, and its answer is rewritten as an Anthropic message (`text` and
`tool_use` content blocks, `stop_reason` end_turn / max_tokens / stop_sequence / tool_use);
streamed, as Anthropic's events (message_start, content_block_start / _delta / _stop,
message_delta, message_stop). Errors use Anthropic's shape, `{"type": "error", "error":
{"type", "message"}}`, so its client raises its own exception classes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterable
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest, random_uuid
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.openai.serving_engine import CleanupStreamingResponse

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 500: "api_error", 503: "overloaded_error"}


def anthropic_error(status: int, message: str) -> JSONResponse:
    """An error in Anthropic's shape."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}},
                        status_code=status)


def _blocks_text(content: Any, param: str) -> tuple[str, list[dict[str, Any]],
                                                    list[dict[str, Any]]]:
    """A message's content: its text, tool calls (tool_use) and tool results."""
    if isinstance(content, str):
        return content, [], []
    if not isinstance(content, list):
        raise APIError(f"{param} must be a string or a list of content blocks.", param=param)
    texts, calls, results = [], [], []
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"{param}.{index}"
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append({"id": block.get("id") or f"toolu_{random_uuid()[:24]}",
                          "type": "function",
                          "function": {"name": block.get("name"),
                                       "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result":
            result = block.get("content", "")
            if isinstance(result, list):
                result = "".join(str(b.get("text", "")) for b in result if isinstance(b, dict))
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": str(result)})
        else:
            raise APIError(f"{where}: content block type {kind!r} is not supported yet "
                           "(text, tool_use, tool_result).", param=where)
    return "".join(texts), calls, results


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's `system` and `messages` as chat messages."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else _blocks_text(system, "system")[0]
        messages.append({"role": "system", "content": text})
    items = body.get("messages")
    if not isinstance(items, list) or not items:
        raise APIError("messages must be a non-empty list.", param="messages")
    for index, message in enumerate(items):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise APIError(f"messages.{index}.role must be user or assistant.",
                           param=f"messages.{index}.role")
        text, calls, results = _blocks_text(message.get("content"),
                                            f"messages.{index}.content")
        messages += results
        if text or calls or not results:
            entry: dict[str, Any] = {"role": role, "content": text or None}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
    return messages


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return kind  # auto / none


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    """The chat completion a Messages request asks for."""
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    if not isinstance(body.get("max_tokens"), int):
        raise APIError("max_tokens is required (an integer).", param="max_tokens")
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list) or not all(isinstance(t, dict) for t in raw_tools):
        raise APIError("tools must be a list of tool objects.", param="tools")
    tools = [{"type": "function", "function": {
        "name": tool.get("name"), "description": tool.get("description"),
        "parameters": tool.get("input_schema") or {"type": "object"}}}
        for tool in raw_tools]
    chat: dict[str, Any] = {
        "model": body.get("model"), "messages": chat_messages(body),
        "max_tokens": body["max_tokens"], "temperature": body.get("temperature"),
        "top_p": body.get("top_p"), "top_k": body.get("top_k"),
        "stop": body.get("stop_sequences"), "tools": tools or None,
        "tool_choice": _tool_choice(body.get("tool_choice")), "stream": bool(body.get("stream")),
    }
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})


def _stop_reason(finish: str | None, stop: Any, has_calls: bool) -> tuple[str, str | None]:
    if has_calls:
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


class ServingMessages:
    """The /v1/messages handler, over the chat handler."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def create(self, body: dict[str, Any], raw_request: Request) -> Response:
        """POST /v1/messages."""
        request = chat_request(body)
        answer = await self.chat.create_chat_completion(request, raw_request)
        if answer.status_code != HTTPStatus.OK:  # the chat handler's OpenAI-shaped error
            try:
                error = json.loads(bytes(answer.body)).get("error", {})
            except ValueError:  # no JSON body (a client that went away)
                error = {}
            return anthropic_error(answer.status_code, str(error.get("message", "")))
        model = self.chat.response_model(request.model)
        if isinstance(answer, CleanupStreamingResponse):
            events = _events(answer.body_iterator, model, body.get("stop_sequences"))
            return CleanupStreamingResponse(events, answer.cleanup)
        chat_json = json.loads(bytes(answer.body))
        choice = chat_json["choices"][0]
        message = choice["message"]
        content: list[dict[str, Any]] = []
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            content.append({"type": "tool_use", "id": call["id"],
                            "name": call["function"]["name"],
                            "input": json.loads(call["function"]["arguments"] or "{}")})
        reason, sequence = _stop_reason(choice["finish_reason"], choice.get("stop_reason"),
                                        bool(message.get("tool_calls")))
        usage = chat_json["usage"]
        return JSONResponse({
            "id": f"msg_{random_uuid()}", "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": {"input_tokens": usage["prompt_tokens"],
                      "output_tokens": usage["completion_tokens"]},
        })


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


async def _events(chunks: AsyncIterable[Any], model: str, stops: Any,
                  ) -> AsyncGenerator[str, None]:
    """Chat stream chunks → Anthropic's stream events (text; tool calls as tool_use blocks
    with their input as one JSON delta)."""
    message: dict[str, Any] = {"id": f"msg_{random_uuid()}", "type": "message", "role": "assistant",
               "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 0, "output_tokens": 0}}
    yield _event("message_start", message=message)
    text_open, finish, stop = False, None, None
    usage: dict[str, Any] = {}
    calls: dict[int, dict[str, Any]] = {}
    async for raw in chunks:
        for line in (raw.decode() if isinstance(raw, bytes) else str(raw)).splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                yield _event("error", error={"type": "api_error",
                                             "message": chunk["error"].get("message")})
                return
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if delta.get("content"):
                    if not text_open:
                        text_open = True
                        yield _event("content_block_start", index=0,
                                     content_block={"type": "text", "text": ""})
                    yield _event("content_block_delta", index=0,
                                 delta={"type": "text_delta", "text": delta["content"]})
                for call in delta.get("tool_calls") or []:
                    stored = calls.setdefault(call["index"], {"id": call.get("id"), "name": "",
                                                              "arguments": ""})
                    function = call.get("function") or {}
                    stored["name"] += function.get("name") or ""
                    stored["arguments"] += function.get("arguments") or ""
                if choice.get("finish_reason"):
                    finish, stop = choice["finish_reason"], choice.get("stop_reason")
    index = 0
    if text_open:
        yield _event("content_block_stop", index=0)
        index = 1
    for _, call in sorted(calls.items()):
        block = {"type": "tool_use", "id": call["id"] or f"toolu_{random_uuid()[:24]}",
                 "name": call["name"], "input": {}}
        yield _event("content_block_start", index=index, content_block=block)
        yield _event("content_block_delta", index=index,
                     delta={"type": "input_json_delta", "partial_json": call["arguments"]})
        yield _event("content_block_stop", index=index)
        index += 1
    reason, sequence = _stop_reason(finish, stop, bool(calls))
    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                 usage={"output_tokens": usage.get("completion_tokens", 0)})
    yield _event("message_stop")
