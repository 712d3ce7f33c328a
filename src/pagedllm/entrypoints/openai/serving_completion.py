"""POST /v1/completions: one engine request per prompt, streamed (SSE) or gathered.

A list of prompts fans out into one engine request each (choice index = prompt index * n +
sequence index). `echo` prepends the prompt; with `max_tokens=0` only the prompt comes back.
Every engine request this handler started is aborted when it ends early (client gone, error).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from pagedllm.entrypoints.openai.errors import APIError, sse_error
from pagedllm.entrypoints.openai.logprobs import align, completion_logprobs
from pagedllm.entrypoints.openai.prompt_embeds import decode_prompt_embeds
from pagedllm.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
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
    merge_async_iterators,
    sse,
)
from pagedllm.multimodal.prompt_embeds import prompt_embeds_item
from pagedllm.outputs import CompletionOutput, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    """Handler of /v1/completions."""

    async def create_completion(self, request: CompletionRequest, raw_request: Request) -> Response:
        """Answer one completion request (JSON, or an SSE stream when `stream`)."""
        lora_request = self.check_model(request.model)
        self.check_task("generate")
        if request.suffix is not None:
            raise APIError("suffix is not currently supported.", param="suffix")
        prompts = self._prepare_prompts(request)
        echo_only = request.echo and request.max_tokens == 0
        base_id = request.request_id or f"cmpl-{random_uuid()}"
        engine_ids = [f"{base_id}-{i}" for i in range(len(prompts))]
        streams = await self.add_requests(
            request, [p.engine_prompt() for p in prompts], engine_ids,
            self._sampling_params(request, echo_only), add_special_tokens=False,
            lora_request=lora_request,
        )
        created = int(time.time())
        if request.stream:
            body = self._stream(request, base_id, created, prompts, streams, echo_only)
            return CleanupStreamingResponse(body, lambda: self.engine.abort(engine_ids))
        try:
            finals = await cancel_on_disconnect(raw_request, _gather(streams))
        finally:
            await self.engine.abort(engine_ids)
        if finals is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        response = self._build_response(request, base_id, created, prompts, finals, echo_only)
        return self.json_response(response, raw_request)

    def _prepare_prompts(self, request: CompletionRequest) -> list[TokenizedPrompt]:
        prompts = self._embeds_prompts(request)
        if request.prompt is None:
            return prompts
        return prompts + self._text_prompts(request)

    def _embeds_prompts(self, request: CompletionRequest) -> list[TokenizedPrompt]:
        """`prompt_embeds`' prompts: placeholder ids and the item holding the rows."""
        embeds = request.prompt_embeds
        if embeds is None:
            return []
        processor = self.engine.engine.input_processor
        if processor.hidden_size is None:
            raise APIError("You must set --enable-prompt-embeds to input prompt_embeds.",
                           param="prompt_embeds")
        if request.echo or request.prompt_logprobs is not None:
            raise APIError("echo and prompt_logprobs need prompt tokens; prompt_embeds has "
                           "none.", param="prompt_embeds")
        prompts = []
        for encoded in [embeds] if isinstance(embeds, str) else embeds:
            try:
                ids, feature = prompt_embeds_item(decode_prompt_embeds(encoded),
                                                  processor.hidden_size, self.max_model_len)
            except ValueError as error:
                raise APIError(str(error), param="prompt_embeds") from None
            self.check_length(len(ids), request.max_tokens, "prompt_embeds")
            prompts.append(TokenizedPrompt(None, ids, [feature]))
        return prompts

    def _text_prompts(self, request: CompletionRequest) -> list[TokenizedPrompt]:
        prompt = request.prompt
        if isinstance(prompt, str):
            raw: list[Any] = [prompt]
        elif prompt and isinstance(prompt[0], int):
            raw = [prompt]
        else:
            raw = list(prompt or [])
        max_tokens = None if request.echo and request.max_tokens == 0 else request.max_tokens
        prompts = []
        for item in raw:
            if isinstance(item, str):
                ids = self.tokenize(item, request.add_special_tokens)
                text: str | None = item
            else:
                ids, text = list(item), None
            ids = self.truncate(ids, request.truncate_prompt_tokens)
            self.check_length(len(ids), max_tokens, "prompt")
            if text is None or request.truncate_prompt_tokens is not None:
                text = self.tokenizer.decode(ids) if request.echo else text
            prompts.append(TokenizedPrompt(text, ids))
        return prompts

    def _sampling_params(self, request: CompletionRequest, echo_only: bool) -> Any:
        # echo with max_tokens=0 runs one step for prompt logprobs and drops its token.
        max_tokens = 1 if echo_only else request.max_tokens
        if request.echo and request.logprobs is not None and request.prompt_logprobs is None:
            # Echoed prompt tokens carry logprobs too, which only prompt logprobs provide.
            request = request.model_copy(update={"prompt_logprobs": request.logprobs})
        return build_sampling_params(request, max_tokens, request.logprobs,
                                     self.generation_defaults,
                                     grammar_backend=self.config.grammar_backend)

    def _choice(
        self, request: CompletionRequest, prompt: TokenizedPrompt, output: RequestOutput,
        seq: CompletionOutput, index: int, echo: bool, echo_only: bool,
        echo_or_first: bool = True,
    ) -> CompletionChoice:
        """One choice (or a stream chunk's); `echo_or_first`: it carries the prompt's token
        ids under return_token_ids (a stream's first chunk of the choice, or the whole
        answer)."""
        token_ids = [] if echo_only else list(seq.token_ids)
        text = "" if echo_only else seq.text
        logprobs = None if echo_only else align(seq.token_ids, seq.logprobs)
        finish_reason = "length" if echo_only and seq.finish_reason else seq.finish_reason
        if echo:
            text = (prompt.text or "") + text
            if logprobs is not None or echo_only:
                prompt_lp = align(prompt.token_ids, output.prompt_logprobs)
                logprobs = prompt_lp + (logprobs or [])
                token_ids = prompt.token_ids + token_ids
        choice = CompletionChoice(
            index=index, text=text, finish_reason=finish_reason,
            stop_reason=None if echo_only else seq.stop_reason,
        )
        listed = bool(request.logprob_token_ids)
        if (request.logprobs is not None or listed) and logprobs is not None:
            choice.logprobs = completion_logprobs(
                token_ids, logprobs, -1 if listed else (request.logprobs or 0), self.tokenizer,
                as_token_ids=self.config.tokens_as_ids(request),
            )
        if request.prompt_logprobs is not None and output.prompt_logprobs is not None:
            choice.prompt_logprobs = format_prompt_logprobs(output.prompt_logprobs)
        if request.return_token_ids:
            choice.prompt_token_ids = list(prompt.token_ids) if echo_or_first else None
            choice.token_ids = [] if echo_only else list(seq.token_ids)
        return choice

    def _build_response(
        self, request: CompletionRequest, response_id: str, created: int,
        prompts: list[TokenizedPrompt], finals: list[RequestOutput], echo_only: bool,
    ) -> CompletionResponse:
        choices, num_generated = [], 0
        for i, (prompt, output) in enumerate(zip(prompts, finals, strict=True)):
            for seq in sorted(output.outputs, key=lambda s: s.index):
                index = i * request.n + seq.index
                choices.append(self._choice(request, prompt, output, seq, index,
                                            request.echo, echo_only))
                num_generated += 0 if echo_only else len(seq.token_ids)
        num_prompt = sum(len(p.token_ids) for p in prompts)
        num_cached = sum(output.num_cached_tokens or 0 for output in finals)
        return CompletionResponse(
            id=response_id, created=created, model=self.response_model(request.model),
            choices=choices,
            usage=generation_usage(num_prompt, num_generated, num_cached),
            system_fingerprint=self.system_fingerprint,
            metrics=self.config.timing(request, list(finals), num_generated),
            kv_transfer_params=finals[0].kv_transfer_params if len(finals) == 1 else None,
        )

    async def _stream(
        self, request: CompletionRequest, response_id: str, created: int,
        prompts: list[TokenizedPrompt], streams: list[AsyncIterator[RequestOutput]],
        echo_only: bool,
    ) -> AsyncGenerator[str, None]:
        echoed: set[int] = set()
        started: set[int] = set()  # choices whose first chunk is out
        num_generated = 0
        num_prompt = sum(len(p.token_ids) for p in prompts)
        cached: dict[int, int] = {}  # prompt index -> its prefix-cache hits
        latest: list[RequestOutput | None] = [None] * len(streams)
        try:
            async for i, output in merge_async_iterators(*streams):
                latest[i] = output
                if output.num_cached_tokens is not None:
                    cached[i] = output.num_cached_tokens
                for seq in output.outputs:
                    index = i * request.n + seq.index
                    echo = request.echo and index not in echoed
                    echoed.add(index)
                    num_generated += 0 if echo_only else len(seq.token_ids)
                    carries_ids = (request.logprobs is not None or request.return_token_ids
                                   or request.logprob_token_ids) and seq.token_ids
                    if not (seq.text or seq.finish_reason or echo or carries_ids):
                        continue  # nothing new yet (text held back by the detokenizer)
                    first = index not in started
                    started.add(index)
                    choice = self._choice(request, prompts[i], output, seq, index, echo,
                                          echo_only, echo_or_first=first)
                    chunk = CompletionResponse(
                        id=response_id, created=created, model=self.response_model(request.model),
                        choices=[choice], system_fingerprint=self.system_fingerprint,
                    )
                    if request.continuous_usage:
                        chunk.usage = generation_usage(num_prompt, num_generated,
                                                       sum(cached.values()))
                    yield sse(chunk)
            if self.config.include_usage(request):
                yield sse(CompletionResponse(
                    id=response_id, created=created, model=self.response_model(request.model),
                    choices=[],
                    usage=generation_usage(num_prompt, num_generated, sum(cached.values())),
                    system_fingerprint=self.system_fingerprint,
                    metrics=self.config.timing(request, latest, num_generated),
                ))
        except Exception as error:  # noqa: BLE001 - reported in the stream after the 200
            yield sse_error(error)
        yield SSE_DONE


async def _gather(streams: list[AsyncIterator[RequestOutput]]) -> list[RequestOutput]:
    finals: list[Any] = [None] * len(streams)
    async for i, output in merge_async_iterators(*streams):
        finals[i] = output
    return finals

