"""POST /v1/responses (OpenAI's Responses API, which vLLM serves), on top of chat.

A Responses request becomes a chat completion: `instructions` a system message, the stored
conversation of `previous_response_id` first, then `input` (a string, or items: messages,
`function_call`s and `function_call_output`s); `tools` (Responses' flat function shape),
`tool_choice`, `text.format` (JSON schema / object) and `max_output_tokens` map to their chat
fields. The chat handler answers it (the same sampling, tool parsing, reasoning parsing and
structured outputs), and its answer is rewritten as a Response: output items `reasoning`,
`message` (`output_text`) and `function_call`; streamed, as the typed events the official
client's `responses.stream` accumulates. Responses are stored in memory (`store`, default
true) for `previous_response_id` and GET /v1/responses/{id}. With `background: true` the
answer is `queued` at once and computed in a task; GET polls it, /cancel stops it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterable
from http import HTTPStatus
from typing import Any, cast

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest, random_uuid
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.openai.serving_engine import CleanupStreamingResponse

# Most responses kept for previous_response_id (oldest dropped first).
MAX_STORED_RESPONSES = 1024
# Responses fields this layer does not build, with their neutral values (else 400).
_UNBUILT: dict[str, tuple[Any, ...]] = {
    "conversation": (None,), "prompt": (None,),
    "include": (None, []), "truncation": (None, "disabled"),
}


class ResponseStore:
    """Stored responses: the Response JSON and the conversation that led to it."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = (
            OrderedDict())

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Keep `response` and its full conversation (its own output included)."""
        self._items[response["id"]] = (response, messages)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The stored response and conversation; 404 when unknown."""
        try:
            return self._items[response_id]
        except KeyError:
            raise APIError(f"Response {response_id!r} not found.", HTTPStatus.NOT_FOUND,
                           param="response_id") from None


def _check_body(body: dict[str, Any]) -> None:
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    if body.get("input") in (None, "", []):
        raise APIError("input must be a non-empty string or list of items.", param="input")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise APIError("previous_response_id must be a string.", param="previous_response_id")
    for name, neutral in _UNBUILT.items():
        if body.get(name) not in neutral:
            raise APIError(f"{name} is not supported yet by this server.", param=name)
    if body.get("background") not in (None, False, True):
        raise APIError("background must be a boolean.", param="background")
    if body.get("background") and body.get("store") is False:
        raise APIError("background responses are stored: they cannot set store=false.",
                       param="background")
    if body.get("background") and body.get("stream"):
        raise APIError("background responses are not streamed yet: poll GET "
                       "/v1/responses/{id} instead.", param="stream")


def _text_of(content: Any, param: str) -> str | list[dict[str, Any]]:
    """A Responses message content as chat content: a string, or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{param} must be a string or a list of content parts.", param=param)
    parts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise APIError(f"{param}.{index}: content part type {kind!r} is not supported "
                           "yet (input_text, output_text).", param=f"{param}.{index}")
        parts.append({"type": "text", "text": str(part.get("text", ""))})
    return parts


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Responses `input` as chat messages (function calls as assistant tool calls, their
    outputs as tool messages)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise APIError("input must be a string or a list of items.", param="input")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        param = f"input.{index}"
        if not isinstance(item, dict):
            raise APIError(f"{param} must be an object.", param=param)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(f"{param}.role must be user, assistant, system or developer.",
                               param=f"{param}.role")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _text_of(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or f"call_{random_uuid()[:24]}",
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": str(item.get("output", ""))})
        elif kind == "reasoning":
            continue  # earlier reasoning is not replayed to the model
        else:
            raise APIError(f"{param}: item type {kind!r} is not supported yet.", param=param)
    return messages


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise APIError(f"tools.{index}: only function tools are supported yet.",
                           param=f"tools.{index}")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                    if k in tool}
        converted.append({"type": "function", "function": function})
    return converted


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "schema"), "schema": fmt.get("schema", {}),
            "strict": fmt.get("strict")}}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    raise APIError(f"text.format type {fmt.get('type')!r} is not supported.",
                   param="text.format")


class OpenAIServingResponses:
    """The /v1/responses handlers, over the chat handler."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat
        self.store = ResponseStore()
        # Background responses still running: id -> the task answering it.
        self._background: dict[str, asyncio.Future[None]] = {}

    def _chat_request(self, body: dict[str, Any], history: list[dict[str, Any]],
                      ) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
        messages = list(history)
        if body.get("instructions"):
            messages = [m for m in messages if m.get("role") != "system"]
            messages.insert(0, {"role": "system", "content": str(body["instructions"])})
        messages += input_messages(body.get("input"))
        chat: dict[str, Any] = {
            "model": body.get("model"), "messages": messages,
            "max_completion_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tools": _chat_tools(body.get("tools")),
            "tool_choice": _chat_tool_choice(body.get("tool_choice")),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "response_format": _response_format(body.get("text")),
            "user": body.get("user"), "stream": bool(body.get("stream")),
        }
        if chat["stream"]:
            chat["stream_options"] = {"include_usage": True}
        for extra in ("seed", "top_k", "min_p", "repetition_penalty", "stop", "ignore_eos",
                      "chat_template_kwargs", "logit_bias", "min_tokens"):
            if extra in body:
                chat[extra] = body[extra]
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in chat.items() if v is not None}), messages

    async def create(self, body: dict[str, Any], raw_request: Request) -> Response:
        """POST /v1/responses."""
        _check_body(body)
        history: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous:
            history = self.store.get(previous)[1]
        request, messages = self._chat_request(body, history)
        if body.get("background"):
            return JSONResponse(self._start_background(body, request, messages))
        answer = await self.chat.create_chat_completion(request, raw_request)
        if answer.status_code != 200:
            return answer
        base = _response_base(body, request.model or "", self.chat)
        if isinstance(answer, CleanupStreamingResponse):
            events = self._events(answer.body_iterator, base, body, messages)
            # The chat stream's cleanup (abort its request) runs however this one ends.
            return CleanupStreamingResponse(events, answer.cleanup)
        chat_json = json.loads(bytes(answer.body))
        response = _finish(base, chat_json, body)
        self._keep(body, response, messages)
        return JSONResponse(response)

    def _keep(self, body: dict[str, Any], response: dict[str, Any],
              messages: list[dict[str, Any]]) -> None:
        if body.get("store", True):
            self.store.put(response, messages + _output_messages(response))

    def get(self, response_id: str) -> dict[str, Any]:
        """GET /v1/responses/{id}: a stored response."""
        return self.store.get(response_id)[0]

    def cancel(self, response_id: str) -> dict[str, Any]:
        """POST /v1/responses/{id}/cancel: a background response stops (its engine request
        is aborted) and is stored as `cancelled`; a finished one is returned as it is."""
        response, messages = self.store.get(response_id)  # 404 when unknown
        if not response.get("background"):
            raise APIError("Only background responses can be cancelled.",
                           param="response_id")
        task = self._background.pop(response_id, None)
        if task is not None and not task.done():
            task.cancel()  # its chat request aborts its engine request as it unwinds
            response = {**response, "status": "cancelled"}
            self.store.put(response, messages)
        return response

    def _start_background(self, body: dict[str, Any], request: ChatCompletionRequest,
                          messages: list[dict[str, Any]]) -> dict[str, Any]:
        """Store the response as queued and answer it in a task (polled with GET)."""
        base = {**_response_base(body, request.model or "", self.chat), "background": True,
                "status": "queued"}
        self.store.put(base, messages)
        task = asyncio.ensure_future(self._answer_in_background(base, body, request, messages))
        self._background[base["id"]] = task
        task.add_done_callback(lambda _: self._background.pop(base["id"], None))
        return base

    async def _answer_in_background(self, base: dict[str, Any], body: dict[str, Any],
                                    request: ChatCompletionRequest,
                                    messages: list[dict[str, Any]]) -> None:
        self.store.put({**base, "status": "in_progress"}, messages)
        try:
            answer = await self.chat.create_chat_completion(
                request, cast("Request", _DetachedRequest()))
        except Exception as error:  # noqa: BLE001 - stored as the response's error
            self.store.put({**base, "status": "failed", "error": {
                "code": "server_error", "message": getattr(error, "message", str(error))}},
                messages)
            return
        chat_json = json.loads(bytes(answer.body))
        if answer.status_code != 200:
            failure = chat_json.get("error") or {}
            self.store.put({**base, "status": "failed", "error": {
                "code": str(failure.get("code")), "message": failure.get("message")}}, messages)
            return
        response = _finish(base, chat_json, body)
        self.store.put(response, messages + _output_messages(response))

    async def _events(self, chunks: AsyncIterable[Any], base: dict[str, Any],
                      body: dict[str, Any], messages: list[dict[str, Any]],
                      ) -> AsyncGenerator[str, None]:
        stream = _EventStream()
        yield stream.event("response.created", response={**base, "status": "in_progress"})
        yield stream.event("response.in_progress", response={**base, "status": "in_progress"})
        async for raw in chunks:
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            for line in text.splitlines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    yield stream.event("error", message=chunk["error"].get("message"),
                                       code=str(chunk["error"].get("code")))
                    return
                for event in stream.feed(chunk):
                    yield event
        for event in stream.close():
            yield event
        response = _finish(base, stream.chat_json(), body)
        self._keep(body, response, messages)
        yield stream.event("response.completed", response=response)


class _DetachedRequest:
    """The request a background response's chat runs with: no client to disconnect (the
    one that asked left with the queued response) and no headers."""

    headers: dict[str, str] = {}

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()  # never: only a cancel stops a background response
        return {"type": "http.disconnect"}


class _EventStream:
    """Chat stream chunks → Responses stream events (text, function calls, reasoning)."""

    def __init__(self) -> None:
        self.sequence = 0
        self.text = ""
        self.reasoning = ""
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.message_id = f"msg_{random_uuid()}"
        self.message_open = False

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def feed(self, chunk: dict[str, Any]) -> list[str]:
        events: list[str] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            self.reasoning += delta.get("reasoning_content") or ""
            if delta.get("content"):
                events += self._open_message()
                self.text += delta["content"]
                events.append(self.event("response.output_text.delta", item_id=self.message_id,
                                         output_index=0, content_index=0,
                                         delta=delta["content"], logprobs=[]))
            for call in delta.get("tool_calls") or []:
                stored = self.calls.setdefault(call["index"], {"name": "", "arguments": "",
                                                               "id": call.get("id")})
                function = call.get("function") or {}
                stored["name"] += function.get("name") or ""
                stored["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def _open_message(self) -> list[str]:
        if self.message_open:
            return []
        self.message_open = True
        item = {"type": "message", "id": self.message_id, "status": "in_progress",
                "role": "assistant", "content": []}
        return [self.event("response.output_item.added", output_index=0, item=item),
                self.event("response.content_part.added", item_id=self.message_id,
                           output_index=0, content_index=0,
                           part={"type": "output_text", "text": "", "annotations": []})]

    def close(self) -> list[str]:
        if not self.message_open:
            return []
        part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
        item = {"type": "message", "id": self.message_id, "status": "completed",
                "role": "assistant", "content": [part]}
        return [self.event("response.output_text.done", item_id=self.message_id,
                           output_index=0, content_index=0, text=self.text, logprobs=[]),
                self.event("response.content_part.done", item_id=self.message_id,
                           output_index=0, content_index=0, part=part),
                self.event("response.output_item.done", output_index=0, item=item)]

    def chat_json(self) -> dict[str, Any]:
        """The streamed answer as the chat response it adds up to."""
        calls = [{"id": c["id"] or f"call_{random_uuid()[:24]}", "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                 for _, c in sorted(self.calls.items())]
        message = {"role": "assistant", "content": self.text or None, "tool_calls": calls}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return {"choices": [{"message": message, "finish_reason": self.finish_reason}],
                "usage": self.usage or {}, "_message_id": self.message_id}


def _response_base(body: dict[str, Any], model: str, chat: OpenAIServingChat,
                   ) -> dict[str, Any]:
    return {
        "id": f"resp_{random_uuid()}", "object": "response", "created_at": int(time.time()),
        "model": chat.response_model(model), "status": "in_progress", "output": [],
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "max_output_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "text": body.get("text") or {"format": {"type": "text"}},
        "reasoning": body.get("reasoning"), "metadata": body.get("metadata") or {},
        "store": body.get("store", True), "error": None, "incomplete_details": None,
        "usage": None,
    }


def _finish(base: dict[str, Any], chat_json: dict[str, Any], body: dict[str, Any],
            ) -> dict[str, Any]:
    """The finished Response from the chat answer."""
    choice = chat_json["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        output.append({"type": "reasoning", "id": f"rs_{random_uuid()}", "summary": [],
                       "content": [{"type": "reasoning_text", "text": reasoning}]})
    if message.get("content"):
        output.append({
            "type": "message", "id": chat_json.get("_message_id") or f"msg_{random_uuid()}",
            "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": message["content"],
                         "annotations": [], "logprobs": []}],
        })
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{random_uuid()}",
                       "call_id": call["id"], "name": call["function"]["name"],
                       "arguments": call["function"]["arguments"], "status": "completed"})
    usage = chat_json.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    incomplete = choice.get("finish_reason") == "length"
    return {
        **base, "output": output, "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", 0),
        },
    }


def _output_messages(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished response's output as chat messages (for previous_response_id)."""
    messages: list[dict[str, Any]] = []
    for item in response["output"]:
        if item["type"] == "message":
            text = "".join(part.get("text", "") for part in item["content"])
            messages.append({"role": "assistant", "content": text})
        elif item["type"] == "function_call":
            messages.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}]})
    return messages
