"""What every OpenAI handler shares: the engine, served names, prompt checks, SSE helpers.

`OpenAIServing` checks the requested model, tokenizes and length-checks prompts the way vLLM
reports them, and frames server-sent events. Handlers subclass it; none of this code runs
the model itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar, cast

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from pagedllm import __version__
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.beam_search import beam_search_async
from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import PerRequestTimingMetrics, SamplingExtras
from pagedllm.entrypoints.openai.request_metrics import (
    ORCA_FORMAT_HEADER,
    orca_headers,
    timing_metrics,
)
from pagedllm.entrypoints.openai.sampling import load_generation_defaults
from pagedllm.entrypoints.openai.served_models import ServedModels
from pagedllm.lora.request import LoRARequest
from pagedllm.multimodal.inputs import MultiModalFeature
from pagedllm.multimodal.media import MediaConnector
from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.reasoning import ReasoningParser
from pagedllm.sampling_params import BeamSearchParams, SamplingParams

T = TypeVar("T")


@dataclass(frozen=True)
class ServingConfig:
    """Server-side settings the handlers need.

    Attributes:
        models: the names clients may pass as `model` (base model and LoRA adapters).
        chat_template: a Jinja template overriding the model's (None: the model's own).
        tool_call_parser: the parser of tool calls in `tool_choice="auto"` replies.
        enable_auto_tool_choice: whether `tool_choice="auto"` is served.
        exclude_tools_when_tool_choice_none: keep tools out of the template for "none".
        grammar_backend: the engine's structured-outputs library ("xgrammar", "guidance").
        media: how image URLs of chat messages are read (limits, allowed places).
        return_tokens_as_token_ids: the default of the request field of that name.
        force_include_usage: every stream ends with a usage chunk, asked for or not.
        generation_config: where sampling defaults come from ("auto": the model's
            generation_config.json; "vllm": none; else a folder holding one).
        reasoning_parser: splits chat replies into reasoning and answer (None: off).
        per_request_metrics: responses of one prompt and choice carry their timing.
    """

    models: ServedModels
    chat_template: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    exclude_tools_when_tool_choice_none: bool = False
    grammar_backend: str = "xgrammar"
    media: MediaConnector = field(default_factory=MediaConnector)
    return_tokens_as_token_ids: bool = False
    force_include_usage: bool = False
    generation_config: str = "auto"
    reasoning_parser: ReasoningParser | None = None
    per_request_metrics: bool = False

    def include_usage(self, request: Any) -> bool:
        """Whether `request`'s stream ends with a usage chunk."""
        return bool(request.include_usage or (request.stream and self.force_include_usage))

    def timing(self, request: Any, finals: list[RequestOutput | None],
               num_generated: int) -> PerRequestTimingMetrics | None:
        """A response's `metrics`: with --enable-per-request-metrics, for one prompt with
        one choice (vLLM's rule), else None."""
        if not self.per_request_metrics or len(finals) != 1 or finals[0] is None:
            return None
        if getattr(request, "n", 1) != 1:
            return None
        return timing_metrics(finals[0], num_generated)

    def tokens_as_ids(self, request: Any) -> bool:
        """Whether `request`'s logprobs tokens are written "token_id:N"."""
        asked = getattr(request, "return_tokens_as_token_ids", None)
        return self.return_tokens_as_token_ids if asked is None else bool(asked)


@dataclass
class TokenizedPrompt:
    """One prompt ready for the engine."""

    text: str | None
    token_ids: list[int]
    mm_features: list[MultiModalFeature] | None = None

    def engine_prompt(self) -> dict[str, Any]:
        """The prompt as AsyncLLM.generate takes it (already tokenized; its images
        already processed)."""
        prompt: dict[str, Any] = {"prompt_token_ids": self.token_ids, "prompt": self.text}
        if self.mm_features:
            prompt["mm_features"] = self.mm_features
        return prompt


def _generation_defaults(source: str, model_dir: str) -> dict[str, Any]:
    """--generation-config: the model's defaults (auto), none (vllm), or a folder's."""
    if source == "vllm":
        return {}
    return load_generation_defaults(model_dir if source == "auto" else source)


class OpenAIServing:
    """Base of the /v1 handlers."""

    def __init__(self, engine: AsyncLLM, config: ServingConfig) -> None:
        self.engine = engine
        self.config = config
        self.tokenizer = engine.get_tokenizer()
        model_config = engine.get_model_config()
        self.max_model_len = model_config.max_model_len
        self.generation_defaults = _generation_defaults(config.generation_config,
                                                        model_config.model_dir)
        digest = hashlib.sha256(
            f"pagedllm-{__version__}-{model_config.model}-{model_config.dtype}".encode()
        ).hexdigest()
        self.system_fingerprint = f"fp_{digest[:10]}"

    @property
    def model_name(self) -> str:
        """The base model's name, reported when a request names no model."""
        return self.config.models.base_names[0]

    def response_model(self, model: str | None) -> str:
        """The `model` of a response: the name the request used (as vLLM reports it)."""
        return model or self.model_name

    def json_response(self, response: BaseModel, raw_request: Request) -> JSONResponse:
        """A non-streamed answer, with the ORCA load report when the request asked for one
        (`endpoint-load-metrics-format: TEXT|JSON`)."""
        asked = raw_request.headers.get(ORCA_FORMAT_HEADER)
        headers = orca_headers(asked, self.engine.latest_scheduler_stats) if asked else None
        return JSONResponse(response.model_dump(), headers=headers)

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter `model` names (None: the base model); 404 for an unknown name."""
        return self.config.models.resolve(model)

    def check_base_model(self, model: str | None, what: str) -> None:
        """Like check_model, but 400 for an adapter (`what` is served by the base only)."""
        if self.check_model(model) is not None:
            raise APIError(f"LoRA adapters serve generation only, not {what}; "
                           f"`{model}` is an adapter.", param="model")

    def check_task(self, task: str, also_ok: str | None = None) -> None:
        """400 unless the model serves `task` (or `also_ok`), naming the tasks it serves."""
        tasks = self.engine.supported_tasks
        if task in tasks or (also_ok is not None and also_ok in tasks):
            return
        raise APIError(
            f"The model does not support the {task!r} task; it serves: {', '.join(tasks)}."
        )

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of `text`."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def truncate(self, token_ids: list[int], truncate_prompt_tokens: int | None) -> list[int]:
        """Keep the last `truncate_prompt_tokens` ids (-1: as many as the context allows)."""
        if truncate_prompt_tokens is None:
            return token_ids
        keep = self.max_model_len - 1 if truncate_prompt_tokens == -1 else truncate_prompt_tokens
        return token_ids[-keep:] if keep > 0 else token_ids

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None, field: str) -> None:
        """400 when the prompt, or prompt + max_tokens, exceeds max_model_len (vLLM's words)."""
        limit = self.max_model_len
        if num_prompt_tokens >= limit:
            raise APIError(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"prompt contains {num_prompt_tokens} input tokens, which leaves no room for "
                "output. Please reduce the length of the input prompt.",
                param=field,
            )
        if max_tokens is not None and num_prompt_tokens + max_tokens > limit:
            raise APIError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {max_tokens} output tokens and your prompt contains "
                f"{num_prompt_tokens} input tokens, for a total of "
                f"{num_prompt_tokens + max_tokens} tokens. Please reduce the length of the "
                "input prompt or the number of requested output tokens.",
                param="max_tokens",
            )

    async def add_requests(
        self,
        request: SamplingExtras,
        engine_prompts: list[dict[str, Any]],
        engine_ids: list[str],
        params: SamplingParams,
        add_special_tokens: bool,
        lora_request: LoRARequest | None = None,
    ) -> list[AsyncIterator[RequestOutput]]:
        """Queue one engine request per prompt; all or none (a failure aborts the rest).
        With `use_beam_search`, each prompt's stream is its beam search instead (one final
        output with the `n` best beams)."""
        if request.kv_transfer_params is not None and (
                self.engine.engine_config.kv_transfer_config is None):
            raise APIError("kv_transfer_params needs a KV connector: start the server with "
                           "--kv-transfer-config.", param="kv_transfer_params")
        if getattr(request, "use_beam_search", False):
            return [self._beam_search(request, prompt, engine_id, params)
                    for prompt, engine_id in zip(engine_prompts, engine_ids, strict=True)]
        if request.cache_salt is not None:
            engine_prompts = [{**p, "cache_salt": request.cache_salt} for p in engine_prompts]
        streams: list[AsyncIterator[RequestOutput]] = []
        try:
            for prompt, engine_id in zip(engine_prompts, engine_ids, strict=True):
                stream = await self.engine.add_request(
                    engine_id, prompt, params, request.priority, add_special_tokens,
                    lora_request,
                )
                streams.append(_raise_on_failure(cast("AsyncGenerator[RequestOutput]", stream)))
        except BaseException:
            await self.engine.abort(engine_ids[: len(streams)])
            raise
        return streams

    def _beam_search(self, request: SamplingExtras, prompt: dict[str, Any], request_id: str,
                     params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """One prompt's beam search (beam width = the request's n) as a request stream."""
        if prompt.get("mm_features"):
            raise APIError("use_beam_search takes text prompts only.", param="use_beam_search")
        room = self.max_model_len - len(prompt["prompt_token_ids"])
        beam_params = BeamSearchParams(
            beam_width=request.n,
            max_tokens=min(params.max_tokens or room, room),
            ignore_eos=request.ignore_eos,
            length_penalty=request.length_penalty,
            include_stop_str_in_output=request.include_stop_str_in_output,
        )
        return _beam_stream(self.engine, request_id, prompt, beam_params)


async def _beam_stream(
    engine: AsyncLLM, request_id: str, prompt: dict[str, Any], params: BeamSearchParams,
) -> AsyncGenerator[RequestOutput, None]:
    """One prompt's beam search as a request stream: one finished output, its `n` choices
    the best beams, best first (vLLM's use_beam_search answer)."""
    prompt_ids = list(prompt["prompt_token_ids"])
    result = await beam_search_async(engine, prompt_ids, params)
    outputs = []
    for index, sequence in enumerate(result.sequences):
        generated = sequence.tokens[len(prompt_ids):]
        outputs.append(CompletionOutput(
            index=index, text=sequence.text or "", token_ids=generated,
            cumulative_logprob=sequence.cum_logprob, finish_reason=sequence.finish_reason,
        ))
    yield RequestOutput(request_id, prompt.get("prompt"), prompt_ids, outputs, finished=True)


async def _raise_on_failure(
    stream: AsyncGenerator[RequestOutput, None],
) -> AsyncGenerator[RequestOutput, None]:
    """Pass the outputs of one engine request on; raise a 500 APIError if the engine failed
    it (finish_reason "error"), as vLLM answers such a request, instead of a truncated
    success. A stream reports it as an error event after its 200."""
    try:
        async for output in stream:
            if any(c.finish_reason == "error" for c in output.outputs):
                raise APIError(
                    f"Request {output.request_id} failed in the engine: the model produced "
                    "non-finite values (NaN or infinity) for it, or its KV cache failed to "
                    "load through the KV connector (kv_load_failure_policy 'fail'). Other "
                    "requests are unaffected.",
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                )
            yield output
    finally:
        await stream.aclose()


class CleanupStreamingResponse(StreamingResponse):
    """A streaming response that runs `cleanup` however the stream ends.

    Starlette may cancel a stream before its body iterator ever starts (client gone), so the
    generator's own `finally` cannot be relied on to abort the engine requests.
    """

    def __init__(
        self, content: AsyncIterator[str], cleanup: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.cleanup()


def format_prompt_logprobs(
    prompt_logprobs: list[dict[int, Any] | None],
) -> list[dict[int, Any] | None]:
    """Prompt logprobs as JSON: token id → {logprob, rank, decoded_token} per position."""
    return [
        None if position is None else {
            token_id: {
                "logprob": float(getattr(entry, "logprob", entry)),
                "rank": getattr(entry, "rank", None),
                "decoded_token": getattr(entry, "decoded_token", None),
            }
            for token_id, entry in position.items()
        }
        for position in prompt_logprobs
    ]


def sse(payload: BaseModel | dict[str, Any]) -> str:
    """One server-sent event frame."""
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json()}\n\n"
    return f"data: {json.dumps(payload)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


async def merge_async_iterators(
    *iterators: AsyncIterator[T],
) -> AsyncGenerator[tuple[int, T], None]:
    """Items of several async iterators as they arrive, tagged with the iterator's index.

    Closing or cancelling the merged generator cancels every source (so each aborts).
    """
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def drain(index: int, iterator: AsyncIterator[T]) -> None:
        try:
            async for item in iterator:
                await queue.put((index, item))
        except Exception as error:  # noqa: BLE001 - re-raised by the consumer
            await queue.put((index, error))
        await queue.put((index, done))

    tasks = [asyncio.ensure_future(drain(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Run `work` until it ends or the client disconnects (then cancel it; None)."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        # The client left: cancelling the work aborts its requests and frees their blocks.
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
