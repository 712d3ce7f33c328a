"""POST /v1/chat/completions: chat template → one engine request → message or SSE deltas.

Messages (and tools) are rendered with the request's `chat_template`, else the server's
`--chat-template`, else the model's own. A stream sends the role first, then content and
tool-call deltas, then each choice's finish_reason, then usage (if asked) and `[DONE]`.
How tools are used (template, grammar, parser) is decided in chat_tools.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from jinja2 import TemplateError

from pagedllm.entrypoints.chat_media import extract_chat_media, template_reads_parts
from pagedllm.entrypoints.chat_utils import conversation_for_template
from pagedllm.entrypoints.openai.chat_tools import ChatToolUse, finish_reason, plan_tool_use
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
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    generation_usage,
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
from pagedllm.reasoning import ReplyStreamer
from pagedllm.tokenizer.tokenizer import apply_chat_template
from pagedllm.tool_calling import ToolCallStreamer


class OpenAIServingChat(OpenAIServing):
    """Handler of /v1/chat/completions."""

    async def chat_prompt(
        self,
        messages: list[ChatMessage],
        chat_template: str | None,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        add_special_tokens: bool = False,
    ) -> TokenizedPrompt:
        """The prompt of `messages` (and `tools`) under the chat template in force: its
        text, its token ids and its images, read (off the event loop) and processed."""
        template = chat_template or self.config.chat_template
        template = template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise APIError(
                "This model has no chat template; start the server with --chat-template or "
                "pass chat_template in the request.", param="chat_template",
            )
        processor = self.engine.engine.input_processor
        try:
            conversation, media = await asyncio.to_thread(
                extract_chat_media, [_template_message(m) for m in messages],
                processor.mm_processor, self.config.media, template_reads_parts(template),
            )
        except ValueError as error:
            raise APIError(str(error), param="messages") from None
        try:
            text = apply_chat_template(
                self.tokenizer, conversation_for_template(conversation), add_generation_prompt,
                template, tools=tools, continue_final_message=continue_final_message,
                template_kwargs=template_kwargs,
            )
        except (TemplateError, ValueError, TypeError) as error:
            raise APIError(f"The chat template failed: {error}", param="messages") from None
        if not media.items:
            return TokenizedPrompt(text, self.tokenize(text, add_special_tokens))
        try:
            processed = await asyncio.to_thread(
                processor.tokenize, media.prompt(text), add_special_tokens
            )
        except ValueError as error:
            raise APIError(str(error), param="messages") from None
        return TokenizedPrompt(text, processed.prompt_token_ids, processed.mm_features)

    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request
    ) -> Response:
        """Answer one chat completion request (JSON, or an SSE stream when `stream`)."""
        lora_request = self.check_model(request.model)
        self.check_task("generate")
        tool_use = plan_tool_use(request, self.config, self.tokenizer)
        prompt = await self.chat_prompt(
            request.messages, request.chat_template, request.add_generation_prompt,
            request.continue_final_message, request.chat_template_kwargs,
            tool_use.template_tools, request.add_special_tokens,
        )
        ids = self.truncate(prompt.token_ids, request.truncate_prompt_tokens)
        if prompt.mm_features and len(ids) < len(prompt.token_ids):
            raise APIError("truncate_prompt_tokens would cut a prompt with images; raise it.",
                           param="truncate_prompt_tokens")
        self.check_length(len(ids), request.requested_max_tokens, "messages")
        prompt.token_ids = ids
        top = (request.top_logprobs or 0) if request.logprobs else None
        params = build_sampling_params(request, request.requested_max_tokens, top,
                                       self.generation_defaults, tool_use.constraint,
                                       self.config.grammar_backend)
        tool_use.adjust(params)
        parser = self.config.reasoning_parser
        if parser is not None and parser.needs_special_tokens:
            params.skip_special_tokens = False  # its markers are special tokens
        response_id = request.request_id or f"chatcmpl-{random_uuid()}"
        streams = await self.add_requests(request, [prompt.engine_prompt()], [response_id],
                                          params, add_special_tokens=False,
                                          lora_request=lora_request)
        created = int(time.time())
        if request.stream:
            body = self._stream(request, response_id, created, prompt, streams[0], tool_use)
            return CleanupStreamingResponse(body, lambda: self.engine.abort(response_id))
        try:
            final = await cancel_on_disconnect(raw_request, _last(streams[0]))
        finally:
            await self.engine.abort(response_id)
        if final is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        response = self._build_response(request, response_id, created, prompt, final, tool_use)
        return self.json_response(response, raw_request)

    def _role_and_echo(self, request: ChatCompletionRequest) -> tuple[str, str]:
        role = "assistant" if request.add_generation_prompt else request.messages[-1].role
        last = request.messages[-1]
        echo = _text_of(last) if (request.echo and last.role == role) else ""
        return role, echo

    def _split_reasoning(self, text: str, prompt: TokenizedPrompt) -> tuple[str | None, str]:
        """A reply's reasoning (None without --reasoning-parser or reasoning) and answer."""
        parser = self.config.reasoning_parser
        if parser is None:
            return None, text
        split = parser.split_reply(prompt.text, text)
        return split.reasoning, split.content or ""

    def _logprobs(self, request: ChatCompletionRequest, seq: CompletionOutput) -> Any:
        if not request.logprobs:
            return None
        entries = align(seq.token_ids, seq.logprobs)
        num_top = -1 if request.logprob_token_ids else (request.top_logprobs or 0)
        return chat_logprobs(seq.token_ids, entries, num_top, self.tokenizer,
                             as_token_ids=self.config.tokens_as_ids(request))

    def _build_response(
        self, request: ChatCompletionRequest, response_id: str, created: int,
        prompt: TokenizedPrompt, final: RequestOutput, tool_use: ChatToolUse,
    ) -> ChatCompletionResponse:
        role, echo = self._role_and_echo(request)
        choices = []
        for seq in sorted(final.outputs, key=lambda s: s.index):
            reasoning, text = self._split_reasoning(seq.text, prompt)
            message = tool_use.message(role, echo + text)
            message.reasoning_content = message.reasoning = reasoning
            choices.append(ChatChoice(
                index=seq.index,
                message=message,
                logprobs=self._logprobs(request, seq),
                finish_reason=finish_reason(seq.finish_reason, bool(message.tool_calls)),
                stop_reason=seq.stop_reason,
                token_ids=list(seq.token_ids) if request.return_token_ids else None,
            ))
        num_generated = sum(len(seq.token_ids) for seq in final.outputs)
        response = ChatCompletionResponse(
            id=response_id, created=created, model=self.response_model(request.model),
            choices=choices,
            usage=generation_usage(len(prompt.token_ids), num_generated,
                                   final.num_cached_tokens),
            system_fingerprint=self.system_fingerprint,
            metrics=self.config.timing(request, [final], num_generated),
            kv_transfer_params=final.kv_transfer_params,
        )
        if request.prompt_logprobs is not None and final.prompt_logprobs is not None:
            response.prompt_logprobs = format_prompt_logprobs(final.prompt_logprobs)
        if request.return_token_ids:
            response.prompt_token_ids = list(prompt.token_ids)
        return response

    def _chunk(
        self, model: str, response_id: str, created: int, choice: ChatStreamChoice
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=response_id, created=created, model=model, choices=[choice],
            system_fingerprint=self.system_fingerprint,
        )

    async def _stream(
        self, request: ChatCompletionRequest, response_id: str, created: int,
        prompt: TokenizedPrompt, stream: AsyncIterator[RequestOutput], tool_use: ChatToolUse,
    ) -> AsyncGenerator[str, None]:
        role, echo = self._role_and_echo(request)
        num_prompt, num_generated = len(prompt.token_ids), 0
        num_cached: int | None = None
        latest: RequestOutput | None = None
        streamers = {index: tool_use.streamer() for index in range(request.n)}
        parser = self.config.reasoning_parser
        thinkers = {index: parser.reply_streamer(prompt.text)
                    for index in range(request.n)} if parser is not None else {}
        try:
            for index in range(request.n):
                delta = DeltaMessage(role=role, content="")
                choice = ChatStreamChoice(index=index, delta=delta)
                first = self._chunk(self.response_model(request.model), response_id, created,
                                    choice)
                if request.return_token_ids and index == 0:  # once, on the first chunk
                    first.prompt_token_ids = list(prompt.token_ids)
                yield sse(first)
                if echo:
                    delta = DeltaMessage(content=echo)
                    yield sse(self._chunk(self.response_model(request.model), response_id, created,
                                          ChatStreamChoice(index=index, delta=delta)))
            async for output in stream:
                latest = output
                if output.num_cached_tokens is not None:
                    num_cached = output.num_cached_tokens
                for seq in output.outputs:
                    num_generated += len(seq.token_ids)
                    for choice in self._stream_choices(request, seq, streamers[seq.index],
                                                       thinkers.get(seq.index)):
                        chunk = self._chunk(self.response_model(request.model), response_id,
                                            created, choice)
                        if request.continuous_usage:
                            chunk.usage = generation_usage(num_prompt, num_generated,
                                                           num_cached)
                        yield sse(chunk)
            if self.config.include_usage(request):
                yield sse(ChatCompletionChunk(
                    id=response_id, created=created, model=self.response_model(request.model),
                    choices=[],
                    usage=generation_usage(num_prompt, num_generated, num_cached),
                    system_fingerprint=self.system_fingerprint,
                    metrics=self.config.timing(request, [latest], num_generated),
                ))
        except Exception as error:  # noqa: BLE001 - reported in the stream after the 200
            yield sse_error(error)
        yield SSE_DONE


    def _stream_choices(
        self, request: ChatCompletionRequest, seq: CompletionOutput,
        streamer: ToolCallStreamer | None, thinker: ReplyStreamer | None = None,
    ) -> list[ChatStreamChoice]:
        """The chunks' choices for one new piece of `seq`: reasoning, content, then
        tool-call pieces; logprobs ride on the first, the finish_reason on the last."""
        final = seq.finish_reason is not None
        text, deltas = seq.text, []
        if thinker is not None:  # the reasoning first; the tool parser sees the answer only
            split = thinker.feed(seq.text, final)
            text = split.content or ""
            if split.reasoning:
                deltas.append(DeltaMessage(reasoning_content=split.reasoning,
                                           reasoning=split.reasoning))
        deltas += _deltas(text, final, streamer)
        carries_ids = bool((request.logprobs or request.return_token_ids) and seq.token_ids)
        if not (deltas or seq.finish_reason or carries_ids):
            return []  # nothing new yet (text held back by the detokenizer or the parser)
        deltas = deltas or [DeltaMessage(content="")]
        choices = [ChatStreamChoice(index=seq.index, delta=delta) for delta in deltas]
        if request.logprobs:
            logprobs = self._logprobs(request, seq) if seq.token_ids else None
            choices[0].logprobs = logprobs or ChatLogprobs(content=[])
        if request.return_token_ids:
            choices[0].token_ids = list(seq.token_ids)
        called = streamer is not None and streamer.called_tools
        choices[-1].finish_reason = finish_reason(seq.finish_reason, called)
        choices[-1].stop_reason = seq.stop_reason
        return choices


def _deltas(text: str, final: bool, streamer: ToolCallStreamer | None) -> list[DeltaMessage]:
    """The message pieces a new piece of a reply's answer adds."""
    if streamer is None:
        return [DeltaMessage(content=text)] if text else []
    step = streamer.feed(text, final=final)
    deltas = [DeltaMessage(content=step.content)] if step.content else []
    for call in step.tool_calls:
        deltas.append(DeltaMessage(tool_calls=[DeltaToolCall(
            index=call.index, id=call.id, type="function" if call.id else None,
            function=DeltaFunctionCall(name=call.name, arguments=call.arguments),
        )]))
    return deltas


def _text_of(message: ChatMessage) -> str:
    """A message's text (its text parts joined by newlines)."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(part.text for part in content if part.text is not None)


def _template_message(message: ChatMessage) -> dict[str, Any]:
    """A request message as plain data: its content (text, or content parts as dicts:
    chat_media.py reads them) and its tool fields when set."""
    content: Any = message.content
    if isinstance(content, list):
        content = [part.model_dump(exclude_none=True) for part in content]
    rendered: dict[str, Any] = {"role": message.role, "content": content or ""}
    for key in ("name", "tool_calls", "tool_call_id"):
        value = getattr(message, key)
        if value is not None:
            rendered[key] = value
    return rendered


async def _last(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for output in stream:
        final = output
    assert final is not None, "a request stream ends with a finished output"
    return final

