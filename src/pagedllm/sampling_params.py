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

# Below this temperature sampling is greedy, as in vLLM.
_SAMPLING_EPS = 1e-5
_MAX_TEMPERATURE_CLAMP = 0.01


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
    # Filled from the stop-string list: chars the detokenizer holds back while streaming.
    output_text_buffer_length: int = field(default=0, init=False)

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
        self._verify_args()
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1

    @property
    def is_greedy(self) -> bool:
        """True when the request takes the most likely token every step."""
        return self.temperature < _SAMPLING_EPS

    @property
    def all_stop_token_ids(self) -> set[int]:
        """Token ids that end the request (the EOS id is handled by the scheduler)."""
        return set(self.stop_token_ids or [])

    def clone(self) -> SamplingParams:
        """A deep copy, so one request cannot change another's parameters."""
        return copy.deepcopy(self)

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
