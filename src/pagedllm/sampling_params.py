"""SamplingParams: how one request samples its output, with vLLM's names and validation.

Plain data (no torch): the scheduler reads the stop conditions, the sampler reads the
sampling fields, the output processor reads the text fields. Invalid values raise ValueError
with a message that names the field, worded as vLLM words it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from pagedllm import envs

# Below this temperature sampling is greedy, as in vLLM.
_SAMPLING_EPS = 1e-5
_MAX_TEMPERATURE_CLAMP = 0.01
_MAX_LOGIT_BIAS = 100.0


@dataclass
class StructuredOutputsParams:
    """A constraint on the output, vLLM's `StructuredOutputsParams`: exactly one of

    Attributes:
        json: a JSON schema (dict or JSON text): the output is one JSON value valid under it.
        regex: a regular expression the whole output matches.
        choice: the output is exactly one of these strings.
        grammar: a grammar in EBNF (GBNF, as llama.cpp writes it) or Lark.
        json_object: True: any JSON object (OpenAI's `response_format: json_object`).
        structural_tag: xgrammar's structural tag, as JSON text.
        disable_any_whitespace: JSON without whitespace between tokens (compact output).
        disable_additional_properties: treat schemas as `additionalProperties: false`.
        whitespace_pattern: accepted for vLLM compatibility only when None (not built).

    The constraint is compiled into a grammar off the step loop; a request waits (without
    holding others back) until it is ready. A malformed schema, regex or grammar raises
    ValueError naming the field when the request is added.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def __post_init__(self) -> None:
        kinds = [name for name in _STRUCTURED_KINDS if getattr(self, name) not in (None, False)]
        if len(kinds) != 1:
            raise ValueError(
                "structured_outputs needs exactly one of json, regex, choice, grammar, "
                f"json_object or structural_tag, got {kinds or 'none'}."
            )
        choice = self.choice
        if choice is not None and (
            not isinstance(choice, list)
            or not choice
            or any(not isinstance(c, str) for c in choice)
        ):
            raise ValueError(
                f"structured_outputs.choice must be a non-empty list of strings, got {choice!r}."
            )
        if self.whitespace_pattern is not None:
            raise ValueError(
                "structured_outputs.whitespace_pattern is not supported (the grammar backends "
                "here take disable_any_whitespace instead)."
            )

    @property
    def kind(self) -> str:
        """Which constraint this is: "json", "regex", "choice", "grammar", "json_object" or
        "structural_tag"."""
        return next(n for n in _STRUCTURED_KINDS if getattr(self, n) not in (None, False))


_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name of StructuredOutputsParams (`SamplingParams(guided_decoding=...)`)."""


class RequestOutputKind(IntEnum):
    """What each streamed RequestOutput carries."""

    CUMULATIVE = 0  # the whole output so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass
class SamplingParams:
    """Sampling parameters of one request (vLLM-compatible).

    `temperature=0` means greedy. `top_k` 0 or -1 disables top-k. `seed` makes sampling
    reproducible per request whatever the batch around it.

    Logprobs: `logprobs=k` returns, for every generated token, its own logprob and rank plus
    the k most likely tokens (`prompt_logprobs=k` the same for prompt tokens 2..P; the first
    has none). -1 means the whole vocabulary; the engine refuses a k above its
    `max_logprobs` (vLLM's `--max-logprobs`, 20 by default; -1 counts as the vocabulary).
    They are the model's *raw* distribution, log_softmax of the logits before
    allowed_token_ids, bad_words, logit_bias, penalties, temperature and top-k/top-p/min-p
    (vLLM v1's default "raw_logprobs" mode), so they do not depend on how the token was
    chosen.

    Penalties and biases apply to the logits before temperature, in vLLM's order:
    allowed_token_ids, bad_words, min_tokens, logit_bias, then repetition_penalty (HF: a seen
    token's logit is divided by it when positive, multiplied when not; prompt and output
    tokens count as seen), then frequency/presence (OpenAI: output tokens only,
    logit -= frequency * count + presence * (count > 0)).

    `best_of` (vLLM v0): sample `best_of` sequences and return the `n` with the highest
    cumulative logprob, once all are finished.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # vLLM's logprob_token_ids: each generated token's logprobs for these token ids instead
    # of the top-k (sets logprobs to 0 when it is None).
    logprob_token_ids: list[int] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    best_of: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's older name of `structured_outputs`; moved there on construction.
    guided_decoding: StructuredOutputsParams | None = None
    # Arguments for logits-processor plugins (logits_processor/), read by their
    # `validate_params` and `update_state` (vLLM's extra_args; the server's vllm_xargs).
    extra_args: dict[str, Any] | None = None
    # Filled from the stop-string list: chars the detokenizer holds back while streaming.
    output_text_buffer_length: int = field(default=0, init=False)
    # Filled by the input processor from `bad_words` (it has the tokenizer): token id sequences.
    bad_words_token_ids: list[list[int]] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if 0 < self.temperature < _MAX_TEMPERATURE_CLAMP:
            self.temperature = _MAX_TEMPERATURE_CLAMP
        self._normalize_logits_fields()
        self._take_guided_decoding()
        self._verify_args()
        verify_logprobs_and_penalties(self)
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1

    @property
    def is_greedy(self) -> bool:
        """True when the request takes the most likely token every step."""
        return self.temperature < _SAMPLING_EPS

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """True when the prompt must be computed, not read from the prefix cache.

        Prompt logprobs need the logits of every prompt position, which a prefix-cache hit
        would skip (vLLM sets its field of this name the same way).
        """
        return self.prompt_logprobs is not None

    @property
    def num_sequences(self) -> int:
        """Sequences to sample: `best_of` when set, else `n` (the best `n` are returned)."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def has_penalties(self) -> bool:
        """True when any of presence, frequency or repetition penalty is active."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def all_stop_token_ids(self) -> set[int]:
        """Token ids that end the request (the EOS id is handled by the scheduler)."""
        return set(self.stop_token_ids or [])

    def clone(self) -> SamplingParams:
        """A deep copy, so one request cannot change another's parameters."""
        return copy.deepcopy(self)

    def _normalize_logits_fields(self) -> None:
        """Copy the container fields and coerce logit_bias keys ("5" → 5) and value range."""
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict, got {self.logit_bias!r}.")
            bias: dict[int, float] = {}
            for key, value in self.logit_bias.items():
                try:
                    token_id = int(key)
                    value = float(value)
                except (TypeError, ValueError):
                    raise ValueError(
                        f"logit_bias must map token ids to numbers, got {key!r}: {value!r}."
                    ) from None
                # OpenAI's range; vLLM clamps instead of rejecting.
                bias[token_id] = min(max(value, -_MAX_LOGIT_BIAS), _MAX_LOGIT_BIAS)
            self.logit_bias = bias
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        if self.logprob_token_ids is not None:
            ids = list(self.logprob_token_ids)
            if not ids or not all(_is_int(t) and t >= 0 for t in ids):
                raise ValueError("logprob_token_ids must be a non-empty list of token ids, "
                                 f"got {self.logprob_token_ids!r}.")
            self.logprob_token_ids = ids
            if self.logprobs is None:
                self.logprobs = 0
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        elif self.bad_words is not None:
            self.bad_words = list(self.bad_words)

    def _take_guided_decoding(self) -> None:
        """`guided_decoding` (vLLM's older name) becomes `structured_outputs`."""
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("Give structured_outputs or guided_decoding, not both.")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        constraint = self.structured_outputs
        if isinstance(constraint, dict):  # e.g. from a JSON request body
            constraint = StructuredOutputsParams(**constraint)
        if constraint is not None and not isinstance(constraint, StructuredOutputsParams):
            raise ValueError(
                "structured_outputs must be a StructuredOutputsParams, got "
                f"{type(constraint).__name__}."
            )
        self.structured_outputs = constraint

    def _verify_args(self) -> None:
        self._verify_type("n", int)
        self._verify_type("top_k", int)
        self._verify_type("min_tokens", int)
        if self.max_tokens is not None:
            self._verify_type("max_tokens", int)
        if self.seed is not None:
            self._verify_type("seed", int)
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        max_n = envs.max_n_sequences()
        if self.n > max_n:
            raise ValueError(
                f"n must be at most {max_n}, got {self.n}. To increase this limit, set the "
                "PAGEDLLM_MAX_N_SEQUENCES environment variable."
            )
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(
                f"min_tokens must be greater than or equal to 0, got {self.min_tokens}."
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}."
            )
        if any(not isinstance(s, str) for s in self.stop):  # type: ignore[union-attr]
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}.")
        if "" in self.stop:  # type: ignore[operator]
            raise ValueError("stop cannot contain an empty string.")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):  # type: ignore[union-attr]
            raise ValueError(
                f"stop_token_ids must be non-negative integers, got {self.stop_token_ids}."
            )
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True.")
        if self.is_greedy and self.n > 1:
            raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")

    def _verify_type(self, name: str, expected: type) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ValueError(f"{name} must be an {expected.__name__}, got {value!r}.")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _verify_num_logprobs(name: str, value: int | None) -> None:
    if value is None:
        return
    # The engine checks the count against its max_logprobs (input_processor.py).
    if not _is_int(value) or value < -1:
        raise ValueError(f"{name} must be non-negative or -1, got {value!r}.")


def verify_logprobs_and_penalties(params: SamplingParams) -> None:
    """Validate the logprobs, penalty, bias and best_of fields (vLLM's messages).

    Vocabulary bounds of logit_bias / allowed_token_ids are checked by the input processor,
    which knows the model.
    """
    _verify_num_logprobs("logprobs", params.logprobs)
    _verify_num_logprobs("prompt_logprobs", params.prompt_logprobs)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
            raise ValueError(f"{name} must be in [-2, 2], got {value}.")
    penalty = params.repetition_penalty
    if not isinstance(penalty, (int, float)) or not (math.isfinite(penalty) and penalty > 0.0):
        raise ValueError(f"repetition_penalty must be greater than zero, got {penalty}.")
    allowed = params.allowed_token_ids
    if allowed is not None:
        if not allowed:
            raise ValueError("allowed_token_ids is not None and empty!")
        if any(not _is_int(t) or t < 0 for t in allowed):
            raise ValueError(
                f"allowed_token_ids must be non-negative integers, got {allowed}."
            )
    if params.logit_bias is not None and any(t < 0 for t in params.logit_bias):
        raise ValueError(
            f"logit_bias keys must be non-negative token ids, got {params.logit_bias}."
        )
    if params.bad_words is not None and any(
        not isinstance(w, str) or not w for w in params.bad_words
    ):
        raise ValueError(f"bad_words must be non-empty strings, got {params.bad_words!r}.")
    _verify_best_of(params)


def _verify_best_of(params: SamplingParams) -> None:
    best_of = params.best_of
    if best_of is None:
        return
    if not _is_int(best_of):
        raise ValueError(f"best_of must be an int, got {best_of!r}.")
    if best_of < params.n:
        raise ValueError(
            f"best_of must be greater than or equal to n, got n={params.n} and "
            f"best_of={best_of}."
        )
    max_n = envs.max_n_sequences()
    if best_of > max_n:
        raise ValueError(
            f"best_of must be at most {max_n}, got {best_of}. To increase this limit, set the "
            "PAGEDLLM_MAX_N_SEQUENCES environment variable."
        )
    if params.is_greedy and best_of > 1:
        raise ValueError(f"best_of must be 1 when using greedy sampling, got {best_of}.")


@dataclass
class BeamSearchParams:
    """Parameters of `LLM.beam_search` (vLLM's names; transformers' scoring).

    Attributes:
        beam_width: beams kept per step, and sequences returned.
        max_tokens: most generated tokens per beam.
        ignore_eos: keep extending beams past EOS (no beam finishes early).
        temperature: accepted for vLLM compatibility; beam search is deterministic and scores
            the model's raw logprobs, so it changes nothing (as in transformers without
            sampling).
        length_penalty: a finished beam scores sum_logprobs / num_generated_tokens ** this.
        include_stop_str_in_output: accepted for vLLM compatibility (no stop strings here).
        early_stopping: transformers' `early_stopping`: False (its default heuristic), True
            (stop once beam_width beams are finished) or "never".
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        if not _is_int(self.beam_width) or self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width!r}.")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens!r}.")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be finite, got {self.length_penalty}.")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(
                f"early_stopping must be True, False or 'never', got {self.early_stopping!r}."
            )
