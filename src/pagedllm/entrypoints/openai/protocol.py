"""Pydantic models of the OpenAI-compatible API: requests, responses, stream chunks, errors.

Field names, defaults and shapes follow OpenAI's API plus vLLM's extra sampling parameters.
Requests accept unknown fields (logged and ignored, as vLLM does). Cross-field checks live
here; mapping to SamplingParams lives in `sampling.py`. No engine code is imported here.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from pagedllm.logger import init_logger

logger = init_logger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_none(value: Any) -> bool:
    """A field left out of the JSON when unset (vLLM's optional extras)."""
    return value is None


def random_uuid() -> str:
    """A random hex id."""
    return uuid.uuid4().hex


# vLLM request fields this server does not build, each with the value that changes nothing.
# Any other value would change the answer, so it is refused with a 400 instead of being
# ignored like an unknown field.
UNBUILT_VLLM_FIELDS: dict[str, Any] = {
    "return_token_offsets": False, "return_prompt_text": False,
    "return_mm_kwargs": False,
    "ec_transfer_params": None,
    "repetition_detection": None, "thinking_token_budget": None,
    "stream_interval": 1, "logits_processors": None,
    "documents": None, "mm_processor_kwargs": None, "media_io_kwargs": None,
    "truncation_side": "left", "routed_experts_prompt_start": None,
}


class OpenAIBaseModel(BaseModel):
    """Base of every request model: unknown extra fields are accepted, logged and ignored;
    a vLLM field this server does not build is refused unless it has its neutral value."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _log_extra_fields(self) -> OpenAIBaseModel:
        for name, value in (self.model_extra or {}).items():
            if name == "logits_processors" and value is not None:  # as vLLM v1 answers
                raise ValueError("logits_processors (per-request logits processors) are not "
                                 "supported: vLLM v1 refuses them too; load a plugin with "
                                 "--logits-processors and pass its arguments in vllm_xargs.")
            if name in UNBUILT_VLLM_FIELDS and value != UNBUILT_VLLM_FIELDS[name]:
                raise ValueError(f"{name} is not supported yet by this server.")
        if self.model_extra:
            logger.warning(
                "The following fields were present in the request but ignored: %s",
                sorted(self.model_extra),
            )
        return self


class StreamOptions(BaseModel):
    """`stream_options`: usage in a final chunk, or on every chunk."""

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class SamplingExtras(OpenAIBaseModel):
    """Sampling fields shared by completions and chat (OpenAI's and vLLM's extras)."""

    model: str | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    n: int = 1
    best_of: int | None = None
    seed: int | None = Field(default=None, ge=_INT64_MIN, le=_INT64_MAX)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # vLLM's sampling extras.
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    priority: int = 0
    request_id: str | None = None
    response_format: dict[str, Any] | None = None
    # Structured outputs: vLLM's field, and its older guided_* extras.
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    structural_tag: str | None = None
    # vLLM's token-id extras: the prompt's and each choice's token ids in the response, and
    # logprobs tokens written "token_id:N" (None: the server's --return-tokens-as-token-ids).
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # vLLM's logprob_token_ids: each generated token's logprobs for these ids (instead of
    # the top-k; completions report them whatever `logprobs`, chat with `logprobs: true`).
    logprob_token_ids: list[int] | None = None
    # vLLM's cache_salt: only requests with the same salt share prefix-cache blocks.
    cache_salt: str | None = None
    # vLLM's vllm_xargs: arguments for the engine's logits-processor plugins (they become
    # SamplingParams.extra_args).
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    # vLLM's kv_transfer_params: for the engine's KV connector (needs one configured).
    kv_transfer_params: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_stream_fields(self) -> SamplingExtras:
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
        return self

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether every streamed chunk carries usage."""
        options = self.stream_options
        return bool(self.include_usage and options and options.continuous_usage_stats)


class CompletionRequest(SamplingExtras):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    # vLLM's prompt_embeds: base64 of `torch.save(tensor [N, hidden])`, one or a list
    # (needs --enable-prompt-embeds); they come before `prompt`'s prompts.
    prompt_embeds: str | list[str] | None = None
    echo: bool = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _check_prompt(self) -> CompletionRequest:
        prompt = self.prompt
        if self.prompt_embeds is not None and prompt in (None, "", []):
            if self.prompt_embeds in ("", []):
                raise ValueError("The decoder prompt cannot be empty (prompt_embeds is empty).")
            self.prompt = None
            return self
        if prompt is None:
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        # vLLM's wording for an empty prompt (its clients match "prompt cannot be empty").
        if prompt == "" or (isinstance(prompt, list) and not prompt) or (
            isinstance(prompt, list) and any(p == "" or (isinstance(p, list) and not p)
                                             for p in prompt)
        ):
            raise ValueError("The decoder prompt cannot be empty (prompt must be non-empty).")
        return self


class TextContentPart(BaseModel):
    """A `{"type": "text", "text": ...}` part of a message's content."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One chat message; `content` is a string or a list of content parts. An assistant
    message may carry `tool_calls`; a `tool` message answers one by `tool_call_id`."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(BaseModel):
    """A tool's function: its name, what it does, and a JSON schema of its parameters."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(BaseModel):
    """One entry of `tools`: `{"type": "function", "function": {...}}`."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(SamplingExtras):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if not self.messages:
            raise ValueError("messages must be a non-empty list of messages.")
        if self.top_logprobs is not None and self.top_logprobs != -1:
            if self.top_logprobs < 0:
                raise ValueError("`top_logprobs` must be a positive value or -1.")
            if self.top_logprobs > 0 and not self.logprobs:
                raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens, else the deprecated max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class TokenizeRequest(OpenAIBaseModel):
    """POST /tokenize: a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _check_one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("Provide exactly one of `prompt` or `messages`.")
        return self


class DetokenizeRequest(OpenAIBaseModel):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[int]


# ------------------------------------------------------------------------------ responses


class PromptTokenUsageInfo(BaseModel):
    """Details of a response's prompt tokens (OpenAI's `prompt_tokens_details`)."""

    cached_tokens: int | None = None


class UsageInfo(BaseModel):
    """Token counts of a response."""

    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


def generation_usage(num_prompt: int, num_generated: int, num_cached: int | None) -> UsageInfo:
    """The usage of a completion or chat response: prompt, generated and total tokens, and
    the prompt tokens found in the prefix cache (None until a request was scheduled)."""
    return UsageInfo(
        prompt_tokens=num_prompt, completion_tokens=num_generated,
        total_tokens=num_prompt + num_generated,
        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=num_cached),
    )


class PerRequestTimingMetrics(BaseModel):
    """A request's timing (vLLM's `metrics`, with --enable-per-request-metrics); None where
    unknown."""

    time_to_first_token_ms: float | None = None  # first scheduled -> first token
    generation_time_ms: float | None = None  # first token -> last token
    queue_time_ms: float | None = None  # arrival -> first scheduled
    mean_itl_ms: float | None = None  # generation time / (tokens - 1); None for one token
    tokens_per_second: float | None = None  # tokens / (first scheduled -> last token)


class CompletionLogProbs(BaseModel):
    """Legacy completions logprobs: parallel lists per generated token."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One choice of a completion (also the shape of a stream chunk's choice)."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[int, Any] | None] | None = None
    # return_token_ids: omitted unless asked for (vLLM's shape).
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_is_none)
    token_ids: list[int] | None = Field(default=None, exclude_if=_is_none)


class CompletionResponse(BaseModel):
    """A /v1/completions response or stream chunk (`object` is the same for both)."""

    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    metrics: PerRequestTimingMetrics | None = Field(default=None, exclude_if=_is_none)
    kv_transfer_params: dict[str, Any] | None = Field(default=None, exclude_if=_is_none)


class TopLogprob(BaseModel):
    """One alternative token in chat logprobs."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(TopLogprob):
    """A generated token in chat logprobs, with its alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """Chat logprobs: one entry per generated token."""

    content: list[ChatLogprobToken] | None = None


class FunctionCall(BaseModel):
    """The function a tool call calls; `arguments` is a JSON object's text."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """One tool call of an assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ResponseMessage(BaseModel):
    """The assistant's message of a full response; with --reasoning-parser, its reasoning
    apart (vLLM's `reasoning_content` and newer `reasoning`, both given)."""

    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning_content: str | None = Field(default=None, exclude_if=_is_none)
    reasoning: str | None = Field(default=None, exclude_if=_is_none)


class DeltaFunctionCall(BaseModel):
    """A piece of a streamed function call: the name once, then argument fragments."""

    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of a streamed tool call; `id` and `type` come with its first piece."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    """What a stream chunk adds to a choice's message."""

    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_is_none)


class ChatStreamChoice(BaseModel):
    """One choice of a chat stream chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_is_none)

    @field_serializer("delta")
    def _delta_without_nulls(self, delta: DeltaMessage) -> dict[str, Any]:
        # OpenAI's deltas carry only what changed: the role once, then content.
        return delta.model_dump(exclude_none=True)


class ChatCompletionResponse(BaseModel):
    """A /v1/chat/completions response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    metrics: PerRequestTimingMetrics | None = Field(default=None, exclude_if=_is_none)
    kv_transfer_params: dict[str, Any] | None = Field(default=None, exclude_if=_is_none)
    prompt_logprobs: list[dict[int, Any] | None] | None = None
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_is_none)


class ChatCompletionChunk(BaseModel):
    """A /v1/chat/completions stream chunk."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    metrics: PerRequestTimingMetrics | None = Field(default=None, exclude_if=_is_none)
    kv_transfer_params: dict[str, Any] | None = Field(default=None, exclude_if=_is_none)
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_is_none)


class ModelCard(BaseModel):
    """One entry of GET /v1/models."""

    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[dict[str, Any]] = Field(default_factory=list)


class LoadLoRAAdapterRequest(BaseModel):
    """POST /v1/load_lora_adapter (vLLM's shape)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str | None = None
    lora_path: str | None = None
    load_inplace: bool = False  # replace an adapter already served under lora_name


class UnloadLoRAAdapterRequest(BaseModel):
    """POST /v1/unload_lora_adapter (vLLM's shape; `lora_int_id` is accepted and unused:
    the name identifies the adapter)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str | None = None
    lora_int_id: int | None = None


class ModelList(BaseModel):
    """GET /v1/models."""

    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class ErrorInfo(BaseModel):
    """The `error` object of an error response (vLLM: `code` is the HTTP status)."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """`{"error": {...}}`."""

    error: ErrorInfo
