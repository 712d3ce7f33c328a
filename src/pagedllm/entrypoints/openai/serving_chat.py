"""POST /v1/chat/completions: chat template → one engine request → message or SSE deltas.

Messages are rendered with the request's `chat_template`, else the server's `--chat-template`,
else the model's own. A stream sends the role first, then content deltas, then each choice's
finish_reason, then usage (if asked) and `[DONE]`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from jinja2 import TemplateError

from pagedllm.entrypoints.openai.errors import APIError, sse_error
from pagedllm.entrypoints.openai.logprobs import align, chat_logprobs
from pagedllm.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatStreamChoice,
    ResponseMessage,
    UsageInfo,
    random_uuid,
)
from pagedllm.entrypoints.openai.sampling import build_sampling_params
from pagedllm.entrypoints.openai.serving_engine import (
    SSE_DONE,
    CleanupStreamingResponse,
    OpenAIServing,
    TokenizedPrompt,
    cancel_on_disconnect,
    format_prompt_logprobs,
    sse,
)
from pagedllm.outputs import CompletionOutput, RequestOutput


def message_text(message: ChatMessage, index: int) -> str:
    """A message's content as one string; list content must be text parts."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise APIError(
                f"messages[{index}].content: only {{'type': 'text'}} parts are supported, "
                f"got type {part.type!r}.",
                param="messages",
            )
        texts.append(part.text)
    return "\n".join(texts)


class OpenAIServingChat(OpenAIServing):
    """Handler of /v1/chat/completions."""

    def render(
        self,
        messages: list[ChatMessage],
        chat_template: str | None,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of `messages` under the chat template in force."""
        template = chat_template or self.config.chat_template
        template = template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise APIError(
                "This model has no chat template; start the server with --chat-template or "
                "pass chat_template in the request.", param="chat_template",
            )
        conversation = [
            {"role": m.role, "content": message_text(m, i)} for i, m in enumerate(messages)
        ]
        try:
            prompt = self.tokenizer.apply_chat_template(
                conversation, chat_template=template, tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(template_kwargs or {}),
            )
        except (TemplateError, ValueError, TypeError) as error:
            raise APIError(f"The chat template failed: {error}", param="messages") from None
        return str(prompt)

    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request
    ) -> Response:
        """Answer one chat completion request (JSON, or an SSE stream when `stream`)."""
        self.check_model(request.model)
        if request.tools and request.tool_choice != "none":
            raise APIError("Tool calling is not supported yet.", param="tools")
        text = self.render(request.messages, request.chat_template,
                           request.add_generation_prompt, request.continue_final_message,
                           request.chat_template_kwargs)
        ids = self.truncate(self.tokenize(text, request.add_special_tokens),
                            request.truncate_prompt_tokens)
        self.check_length(len(ids), request.requested_max_tokens, "messages")
        prompt = TokenizedPrompt(text, ids)
        top = (request.top_logprobs or 0) if request.logprobs else None
        params = build_sampling_params(request, request.requested_max_tokens, top,
                                       self.generation_defaults)
        response_id = request.request_id or f"chatcmpl-{random_uuid()}"
        streams = await self.add_requests(request, [prompt.engine_prompt()], [response_id],
                                          params, add_special_tokens=False)
        created = int(time.time())
        if request.stream:
            body = self._stream(request, response_id, created, prompt, streams[0])
            return CleanupStreamingResponse(body, lambda: self.engine.abort(response_id))
        try:
            final = await cancel_on_disconnect(raw_request, _last(streams[0]))
        finally:
            await self.engine.abort(response_id)
        if final is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        response = self._build_response(request, response_id, created, prompt, final)
        return JSONResponse(response.model_dump())

    def _role_and_echo(self, request: ChatCompletionRequest) -> tuple[str, str]:
        role = "assistant" if request.add_generation_prompt else request.messages[-1].role
        last = request.messages[-1]
        echo = message_text(last, len(request.messages) - 1) if (
            request.echo and last.role == role) else ""
        return role, echo

    def _logprobs(self, request: ChatCompletionRequest, seq: CompletionOutput) -> Any:
        if not request.logprobs:
            return None
        entries = align(seq.token_ids, seq.logprobs)
        return chat_logprobs(seq.token_ids, entries, request.top_logprobs or 0, self.tokenizer)

    def _build_response(
        self, request: ChatCompletionRequest, response_id: str, created: int,
        prompt: TokenizedPrompt, final: RequestOutput,
    ) -> ChatCompletionResponse:
        role, echo = self._role_and_echo(request)
        choices = [
            ChatChoice(
                index=seq.index,
                message=ResponseMessage(role=role, content=echo + seq.text),
                logprobs=self._logprobs(request, seq),
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            )
            for seq in sorted(final.outputs, key=lambda s: s.index)
        ]
        num_generated = sum(len(seq.token_ids) for seq in final.outputs)
        response = ChatCompletionResponse(
            id=response_id, created=created, model=self.model_name, choices=choices,
            usage=_usage(len(prompt.token_ids), num_generated),
            system_fingerprint=self.system_fingerprint,
        )
        if request.prompt_logprobs is not None and final.prompt_logprobs is not None:
            response.prompt_logprobs = format_prompt_logprobs(final.prompt_logprobs)
        return response

    def _chunk(
        self, response_id: str, created: int, choice: ChatStreamChoice
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=response_id, created=created, model=self.model_name, choices=[choice],
            system_fingerprint=self.system_fingerprint,
        )

    async def _stream(
        self, request: ChatCompletionRequest, response_id: str, created: int,
        prompt: TokenizedPrompt, stream: AsyncIterator[RequestOutput],
    ) -> AsyncGenerator[str, None]:
        role, echo = self._role_and_echo(request)
        num_prompt, num_generated = len(prompt.token_ids), 0
        try:
            for index in range(request.n):
                delta = ResponseMessage(role=role, content="")
                yield sse(self._chunk(response_id, created, ChatStreamChoice(index=index,
                                                                             delta=delta)))
                if echo:
                    delta = ResponseMessage(content=echo)
                    yield sse(self._chunk(response_id, created,
                                          ChatStreamChoice(index=index, delta=delta)))
            async for output in stream:
                for seq in output.outputs:
                    num_generated += len(seq.token_ids)
                    has_logprobs = bool(request.logprobs and seq.token_ids)
                    if not (seq.text or seq.finish_reason or has_logprobs):
                        continue  # nothing new yet (text held back by the detokenizer)
                    choice = ChatStreamChoice(
                        index=seq.index, delta=ResponseMessage(content=seq.text),
                        logprobs=self._logprobs(request, seq) if seq.token_ids else None,
                        finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
                    )
                    if request.logprobs and choice.logprobs is None:
                        choice.logprobs = ChatLogprobs(content=[])
                    chunk = self._chunk(response_id, created, choice)
                    if request.continuous_usage:
                        chunk.usage = _usage(num_prompt, num_generated)
                    yield sse(chunk)
            if request.include_usage:
                yield sse(ChatCompletionChunk(
                    id=response_id, created=created, model=self.model_name, choices=[],
                    usage=_usage(num_prompt, num_generated),
                    system_fingerprint=self.system_fingerprint,
                ))
        except Exception as error:  # noqa: BLE001 - reported in the stream after the 200
            yield sse_error(error)
        yield SSE_DONE


async def _last(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for output in stream:
        final = output
    assert final is not None, "a request stream ends with a finished output"
    return final


def _usage(num_prompt: int, num_generated: int) -> UsageInfo:
    return UsageInfo(prompt_tokens=num_prompt, completion_tokens=num_generated,
                     total_tokens=num_prompt + num_generated)
