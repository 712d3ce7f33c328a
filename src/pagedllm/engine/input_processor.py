"""InputProcessor: prompt (text, token ids) + SamplingParams → validated EngineCoreRequest.

Runs in the frontend: it tokenizes, checks lengths and token ids against the model, and
resolves defaults (`max_tokens`), so the core receives only requests it can run. A pooling
request (PoolingParams) is checked against the tasks the model serves and truncated as it
asks (`truncate_prompt_tokens`); it may fill the whole `max_model_len`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedllm.config import ModelConfig
from pagedllm.engine.protocol import EngineCoreRequest
from pagedllm.multimodal.inputs import MultiModalFeature
from pagedllm.multimodal.prompt_embeds import prompt_embeds_item
from pagedllm.pooling_params import PoolingParams
from pagedllm.request import RequestData
from pagedllm.sampling_params import SamplingParams
from pagedllm.structured_output import check_constraint

# What `LLM.generate` and `LLMEngine.add_request` accept as one prompt.
PromptType = str | dict[str, Any]


if TYPE_CHECKING:
    from pagedllm.multimodal.processor import MultiModalProcessor

# A pooling request samples nothing; the core's Request still carries sampling params.
_POOLING_SAMPLING_PARAMS = SamplingParams(max_tokens=1)


@dataclass
class ProcessedPrompt:
    """A prompt after tokenization: the text (if given as text), its token ids, its
    token types (a cross-encoder pair's, given as `{"prompt_token_ids", "token_type_ids"}`)
    and its images / videos, processed (`{"prompt", "multi_modal_data"}`)."""

    prompt: str | None
    prompt_token_ids: list[int]
    token_type_ids: list[int] | None = None
    mm_features: list[MultiModalFeature] | None = None


def _cache_salt(prompt: PromptType) -> str | None:
    """A prompt dict's `cache_salt` (vLLM's prompt field), checked."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}.")
    return salt


def make_mm_processor(model_config: ModelConfig) -> MultiModalProcessor | None:
    """The multimodal processor of a vision-language model; None for a text-only one."""
    from pagedllm.multimodal.processor import MultiModalProcessor, supports_multimodal

    if not supports_multimodal(model_config.architecture):
        return None
    return MultiModalProcessor(
        model_config.model_dir, model_config.architecture, model_config.hf_config,
        model_config.limit_mm_per_prompt, default_kwargs=model_config.mm_processor_kwargs,
    )


class InputProcessor:
    """Validates and tokenizes prompts for one model.

    Args:
        tokenizer: the model's HF tokenizer.
        max_model_len: longest prompt + output.
        vocab_size: number of token ids the model accepts.
        eos_token_id: the model's EOS id, or None.
        grammar_backend: the structured-outputs library constraints are checked for.
        end_of_turn_ids: other ids that end generation like EOS (Gemma's <end_of_turn>):
            added to each request's stop_token_ids unless it sets ignore_eos.
        mm_processor: a vision-language model's processor of images / videos (None: the
            model reads text only, and prompts with multi_modal_data are refused).
        max_logprobs: the most logprobs a request may ask for.
        logits_processors: the engine's logits-processor plugin classes.
        prompt_embeds_hidden_size: the hidden size prompt embeddings must have; None:
            `prompt_embeds` prompts are refused (enable_prompt_embeds is off).
    """

    def __init__(
        self, tokenizer: Any, max_model_len: int, vocab_size: int, eos_token_id: int | None,
        grammar_backend: str = "xgrammar",
        end_of_turn_ids: tuple[int, ...] = (),
        mm_processor: MultiModalProcessor | None = None,
        max_logprobs: int = 20,
        logits_processors: tuple[type, ...] = (),
        prompt_embeds_hidden_size: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        # Plugin classes: each checks a request's arguments (extra_args) on arrival.
        self.logits_processors = logits_processors
        # The model's hidden size when prompts may come as embeddings (None: they may not).
        self.hidden_size = prompt_embeds_hidden_size
        self.max_logprobs = max_logprobs
        self.mm_processor = mm_processor
        self.end_of_turn_ids = end_of_turn_ids
        self.grammar_backend = grammar_backend
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        # What the model serves, and its embedding size (for `dimensions`); set by the
        # engine for pooling models.
        self.supported_tasks: tuple[str, ...] = ("generate",)
        self.embedding_size: int | None = None

    def process(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        add_special_tokens: bool = True,
    ) -> tuple[EngineCoreRequest, ProcessedPrompt]:
        """Tokenize and validate one prompt; returns the core request and the prompt."""
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"sampling_params must be a SamplingParams, got {type(params).__name__}."
            )
        if params.structured_outputs is not None:
            # A bad schema fails here, not queued.
            check_constraint(params.structured_outputs, self.grammar_backend)
        if params.extra_args is not None and not isinstance(params.extra_args, dict):
            raise ValueError(f"extra_args must be a dict, got {type(params.extra_args).__name__}.")
        for processor_class in self.logits_processors:
            processor_class.validate_params(params)  # type: ignore[attr-defined]
        processed = self.tokenize(prompt, add_special_tokens)
        if params.prompt_logprobs is not None and isinstance(prompt, dict) and (
                prompt.get("prompt_embeds") is not None):
            raise ValueError("prompt_logprobs need prompt tokens; a prompt_embeds prompt has "
                             "none.")
        self._check_prompt(processed.prompt_token_ids)
        params = self._resolve_params(params, len(processed.prompt_token_ids))
        request = EngineCoreRequest(
            request_id,
            RequestData(processed.prompt_token_ids, params, self.eos_token_id,
                        mm_features=processed.mm_features, cache_salt=_cache_salt(prompt)),
            arrival_time=arrival_time if arrival_time is not None else time.time(),
        )
        return request, processed

    def process_pooling(
        self,
        request_id: str,
        prompt: PromptType,
        params: PoolingParams,
        arrival_time: float | None = None,
        add_special_tokens: bool = True,
    ) -> tuple[EngineCoreRequest, ProcessedPrompt]:
        """Tokenize (truncating as asked) and validate one pooling prompt.

        Raises:
            ValueError: for a task the model does not serve, `dimensions` above the
                embedding size, or a prompt longer than max_model_len without truncation.
        """
        if params.task is None:
            raise ValueError("PoolingParams.task must be set (embed, classify, ...).")
        params = params.verify(params.task, self.supported_tasks)
        size = self.embedding_size
        if params.dimensions is not None and size is not None and params.dimensions > size:
            raise ValueError(
                f"dimensions={params.dimensions} is more than the model's embedding size "
                f"({size})."
            )
        if isinstance(prompt, dict) and prompt.get("multi_modal_data") is not None:
            raise ValueError("multi_modal_data: pooling requests take text only.")
        processed = self._tokenize_truncated(prompt, params, add_special_tokens)
        self._check_pooling_prompt(processed.prompt_token_ids)
        data = RequestData(
            processed.prompt_token_ids, _POOLING_SAMPLING_PARAMS, None,
            pooling_params=params, token_type_ids=processed.token_type_ids,
        )
        arrival_time = arrival_time if arrival_time is not None else time.time()
        return EngineCoreRequest(request_id, data, arrival_time=arrival_time), processed

    def _tokenize_truncated(
        self, prompt: PromptType, params: PoolingParams, add_special_tokens: bool
    ) -> ProcessedPrompt:
        """The prompt's tokens, cut to `truncate_prompt_tokens` as vLLM cuts them: text by
        the tokenizer (its special tokens kept), token ids to their last k."""
        keep = params.truncate_prompt_tokens
        if keep is None:
            return self.tokenize(prompt, add_special_tokens)
        if keep == -1:
            keep = self.max_model_len
        if keep > self.max_model_len:
            raise ValueError(
                f"truncate_prompt_tokens ({keep}) is greater than max_model_len "
                f"({self.max_model_len}). Please select a smaller truncation size."
            )
        text = prompt if isinstance(prompt, str) else None
        if isinstance(prompt, dict) and "prompt_token_ids" not in prompt:
            text = prompt.get("prompt") if isinstance(prompt.get("prompt"), str) else None
        if text is not None:
            encoded = self.tokenizer(
                text, add_special_tokens=add_special_tokens, truncation=True, max_length=keep
            )
            return ProcessedPrompt(text, list(encoded["input_ids"]))
        processed = self.tokenize(prompt, add_special_tokens)
        types = processed.token_type_ids
        return ProcessedPrompt(
            processed.prompt,
            processed.prompt_token_ids[-keep:],
            types[-keep:] if types is not None else None,
        )

    def _check_pooling_prompt(self, prompt_token_ids: list[int]) -> None:
        # A pooling input may fill the whole context: nothing is generated after it.
        if len(prompt_token_ids) > self.max_model_len:
            raise ValueError(
                f"The input (length {len(prompt_token_ids)}) is longer than the maximum model "
                f"length of {self.max_model_len}. Shorten it, or set truncate_prompt_tokens "
                "(-1: to max_model_len)."
            )
        self._check_token_ids(prompt_token_ids)

    def _check_token_ids(self, prompt_token_ids: list[int]) -> None:
        if not prompt_token_ids:
            raise ValueError("The decoder prompt cannot be empty.")
        bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"Token id(s) {bad[:8]} in the prompt are out of vocabulary "
                f"(vocabulary size: {self.vocab_size})."
            )

    def tokenize(self, prompt: PromptType, add_special_tokens: bool = True) -> ProcessedPrompt:
        """Turn a text prompt, `{"prompt": text}`, `{"prompt_token_ids": ids}` (with the
        `mm_features` of an already processed multimodal prompt) or `{"prompt",
        "multi_modal_data"}` into ids (and processed images)."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
            return ProcessedPrompt(prompt, list(ids))
        if isinstance(prompt, dict) and prompt.get("prompt_embeds") is not None:
            return self._process_prompt_embeds(prompt)
        if isinstance(prompt, dict) and prompt.get("multi_modal_data") is not None:
            return self._process_multimodal(prompt, add_special_tokens)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, list) or any(
                isinstance(t, bool) or not isinstance(t, int) for t in ids
            ):
                raise ValueError("prompt_token_ids must be a list of integers.")
            types = prompt.get("token_type_ids")
            if types is not None and (
                not isinstance(types, list) or len(types) != len(ids)
                or any(t not in (0, 1) for t in types)
            ):  # fmt: skip
                raise ValueError("token_type_ids must be a list of 0/1, one per prompt token.")
            features = prompt.get("mm_features")
            if features is not None and (
                not isinstance(features, list)
                or not all(isinstance(f, MultiModalFeature) for f in features)
            ):
                raise ValueError("mm_features must be a list of MultiModalFeature (processed "
                                 "by this model's processor).")
            return ProcessedPrompt(prompt.get("prompt"), list(ids), types, features or None)
        if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
            return self.tokenize(prompt["prompt"], add_special_tokens)
        raise ValueError(
            "A prompt must be a string, {'prompt': str} or {'prompt_token_ids': list[int]}, "
            f"got {type(prompt).__name__}."
        )

    def _process_prompt_embeds(self, prompt: dict[str, Any]) -> ProcessedPrompt:
        """`{"prompt_embeds": [N, hidden] tensor}`: N placeholder ids and the one item that
        gives their embeddings (multimodal/prompt_embeds.py)."""
        if self.hidden_size is None:
            raise ValueError("prompt_embeds: start the engine with enable_prompt_embeds=True "
                             "(--enable-prompt-embeds).")
        if prompt.get("multi_modal_data") is not None or "prompt_token_ids" in prompt:
            raise ValueError("prompt_embeds is a whole prompt: give it without "
                             "prompt_token_ids or multi_modal_data.")
        ids, feature = prompt_embeds_item(prompt["prompt_embeds"], self.hidden_size,
                                          self.max_model_len)
        return ProcessedPrompt(None, ids, None, [feature])

    def _process_multimodal(
        self, prompt: dict[str, Any], add_special_tokens: bool
    ) -> ProcessedPrompt:
        """`{"prompt", "multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids"}`
        through the model's processor (vLLM's prompt replacement)."""
        if self.mm_processor is None:
            raise ValueError(
                "multi_modal_data: this model reads text only; it takes no images or video."
            )
        text = prompt.get("prompt")
        if not isinstance(text, str):
            raise ValueError(
                "multi_modal_data needs a text 'prompt' with the items' placeholders "
                f"(such as {self.mm_processor.placeholder('image')!r})."
            )
        kwargs = prompt.get("mm_processor_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError("mm_processor_kwargs must be a dict.")
        ids, features = self.mm_processor.process(
            text, prompt["multi_modal_data"], kwargs, prompt.get("multi_modal_uuids"),
            add_special_tokens,
        )
        return ProcessedPrompt(text, ids, mm_features=features or None)

    def _check_prompt(self, prompt_token_ids: list[int]) -> None:
        self._check_token_ids(prompt_token_ids)
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt (length {len(prompt_token_ids)}) is longer than the maximum model "
                f"length of {self.max_model_len} minus one token of output. Make sure that "
                "`max_model_len` is larger than the number of prompt tokens."
            )

    def _resolve_params(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        self._check_token_ids_in_vocab(params)
        self._check_num_logprobs(params)
        params = params.clone()
        if params.bad_words:
            params.bad_words_token_ids = self._tokenize_bad_words(params.bad_words)
        if self.end_of_turn_ids and not params.ignore_eos:
            stop_ids = list(params.stop_token_ids or [])
            params.stop_token_ids = stop_ids + [
                t for t in self.end_of_turn_ids if t not in stop_ids
            ]
        room = self.max_model_len - num_prompt_tokens
        if params.max_tokens is None or params.max_tokens > room:
            # The scheduler also caps at max_model_len; resolving here keeps them in sync.
            params.max_tokens = room
            params.min_tokens = min(params.min_tokens, room)
        return params

    def _check_num_logprobs(self, params: SamplingParams) -> None:
        """vLLM's rule: a request's logprobs and prompt_logprobs (-1: the whole vocabulary)
        may not exceed max_logprobs (-1: the whole vocabulary)."""
        limit = self.vocab_size if self.max_logprobs == -1 else self.max_logprobs
        listed = len(params.logprob_token_ids or [])
        if listed > limit:
            raise ValueError(f"logprob_token_ids lists {listed} tokens, which is greater than "
                             f"max allowed: {limit}")
        for kind, value in (("sample", params.logprobs), ("prompt", params.prompt_logprobs)):
            asked = self.vocab_size if value == -1 else value
            if asked is not None and asked > limit:
                raise ValueError(
                    f"Requested {kind} logprobs of {asked}, which is greater than max "
                    f"allowed: {limit}"
                )

    def _check_token_ids_in_vocab(self, params: SamplingParams) -> None:
        for name, token_ids in (
            ("stop_token_ids", params.stop_token_ids or []),
            ("logit_bias", list(params.logit_bias or {})),
            ("logprob_token_ids", params.logprob_token_ids or []),
        ):
            bad = [t for t in token_ids if t >= self.vocab_size]
            if bad:
                raise ValueError(
                    f"token_id(s) {bad} in {name} contain out-of-vocab token ids. "
                    f"Vocabulary size: {self.vocab_size}"
                )
        if any(t >= self.vocab_size for t in params.allowed_token_ids or []):
            raise ValueError("allowed_token_ids contains out-of-vocab token id!")

    def _tokenize_bad_words(self, bad_words: list[str]) -> list[list[int]]:
        """Token id sequences to ban for each word, at the start of a text and after a space.

        The spaced form is kept only when the space merges into the word's first token (the
        same number of tokens, a different first token): a standalone space token would ban
        the word's bare form after any space, which the first form already covers.
        """
        sequences: list[list[int]] = []
        for word in bad_words:
            bare = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            candidates = [bare]
            if spaced and len(spaced) == len(bare) and spaced[0] != bare[0]:
                candidates.append(spaced)
            for ids in candidates:
                if ids and list(ids) not in sequences:
                    sequences.append(list(ids))
        return sequences
