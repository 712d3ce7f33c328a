"""SpeculativeConfig: vLLM's `speculative_config`, validated and resolved.

Users pass a dict (`LLM(speculative_config={...})`) or JSON (`--speculative-config '{...}'`)
with vLLM's keys. `method` may be left out: with a `model` it is "draft_model" (or the
head's kind, read from its config), without one it is "ngram". This module must not import
torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from pagedllm.utils.json_args import parse_json_arg

SPEC_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "medusa")
# Methods whose proposals come from a model (a draft model or heads over the target's states).
MODEL_METHODS = ("draft_model", "eagle", "eagle3", "medusa")
# With n-gram lookup on, a step of more requests than this proposes nothing (the default of
# `disable_by_batch_size`): a larger CPU batch is compute-bound, so verifying drafts costs
# about as much as decoding them would (BENCHMARKS.md, "Speculative decoding"). Where
# bfloat16 matmuls are native (AMX) batches up to 32 still gain (the platform says so).
DEFAULT_DISABLE_BY_BATCH_SIZE = 4
# vLLM's default n-gram length when neither bound is given.
DEFAULT_PROMPT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    """How draft tokens are proposed and verified (vLLM's `speculative_config` keys).

    Attributes:
        method: one of SPEC_METHODS.
        num_speculative_tokens: draft tokens proposed per request and step (k).
        model: the draft model or head checkpoint (a folder, or a .gguf for a draft model);
            None for ngram.
        prompt_lookup_min / prompt_lookup_max: n-gram lengths tried, longest first: the
            last n tokens are looked up in the request's earlier tokens and the k tokens
            after the latest match are proposed.
        disable_by_batch_size: a step with more running requests than this proposes no
            drafts (the batch is compute-bound); None: the method's default (ngram: 32 for a
            bfloat16 model on a CPU with native bfloat16 matmuls, else 4; 8 with a draft
            model or head).
        draft_model_config: the draft model's resolved ModelConfig (method draft_model).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 5
    model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    disable_by_batch_size: int | None = None
    draft_model_config: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_config method must be one of {', '.join(SPEC_METHODS)}, got "
                f"{self.method!r}."
            )
        _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=1)
        if self.method in MODEL_METHODS and not self.model:
            raise ValueError(f"speculative_config method {self.method!r} needs a 'model'.")
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("speculative_config method 'ngram' takes no 'model'.")
            low, high = self.prompt_lookup_min, self.prompt_lookup_max
            for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
                if value is not None:
                    _check_int(name, value, minimum=1)
            low = low if low is not None else (high or DEFAULT_PROMPT_LOOKUP)
            high = high if high is not None else max(low, DEFAULT_PROMPT_LOOKUP)
            if low > high:
                raise ValueError(
                    f"speculative_config prompt_lookup_min ({low}) is larger than "
                    f"prompt_lookup_max ({high})."
                )
            object.__setattr__(self, "prompt_lookup_min", low)
            object.__setattr__(self, "prompt_lookup_max", high)
        if self.disable_by_batch_size is not None:
            _check_int("disable_by_batch_size", self.disable_by_batch_size, minimum=1)

    @property
    def max_batch_size(self) -> int:
        """The most running requests of a step that still proposes drafts."""
        if self.disable_by_batch_size is not None:
            return self.disable_by_batch_size
        return DEFAULT_DISABLE_BY_BATCH_SIZE if self.method == "ngram" else 8

    @property
    def num_lookahead_slots(self) -> int:
        """KV slots past its tokens a sampling request needs for the drafter's own KV
        (its guesses); 0 for drafters without a KV cache."""
        if self.method in ("draft_model", "eagle", "eagle3"):
            return self.num_speculative_tokens
        return 0

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | str) -> SpeculativeConfig:
        """From a SpeculativeConfig, a dict of vLLM's keys or their JSON text.

        Raises:
            ValueError: naming an unknown key or a bad value.
        """
        if isinstance(value, SpeculativeConfig):
            return value
        value = parse_json_arg(value, "speculative_config")
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict, got {value!r}.")
        allowed = {f.name for f in fields(cls)} - {"draft_model_config"}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(
                f"speculative_config has unknown key(s) {unknown}; known: {sorted(allowed)}."
            )
        value = dict(value)
        if value.get("method") is None:
            value["method"] = "draft_model" if value.get("model") else "ngram"
        if value["method"] == "eagle-3":
            value["method"] = "eagle3"
        return cls(**value)

    def with_batch_limit(self, disable_by_batch_size: int) -> SpeculativeConfig:
        """This config with its resolved `disable_by_batch_size`."""
        return replace(self, disable_by_batch_size=disable_by_batch_size)

    def with_draft_model(self, model_config: Any) -> SpeculativeConfig:
        """This config with its draft model's resolved ModelConfig."""
        return replace(self, draft_model_config=model_config)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"speculative_config {name} must be an integer >= {minimum}, got {value!r}."
        )
