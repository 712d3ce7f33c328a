"""User-facing results: RequestOutput and CompletionOutput, with vLLM's fields."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """One token's entry in a position's logprobs dict (vLLM's `Logprob`).

    Attributes:
        logprob: log-probability under the model's raw distribution (before penalties and
            temperature).
        rank: 1 for the most likely token; the top-k are ranked by position, the scored
            (sampled or prompt) token by 1 + the number of strictly more likely tokens.
        decoded_token: the token decoded on its own (`tokenizer.decode([token_id])`).
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: token id -> Logprob, the scored token first, then the top-k.
LogprobsDict = dict[int, Logprob]
SampleLogprobs = list[LogprobsDict]
PromptLogprobs = list[LogprobsDict | None]


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    Attributes:
        index: which of the request's `n` sequences this is.
        text: generated text (stop string excluded unless include_stop_str_in_output).
        token_ids: generated token ids.
        cumulative_logprob: sum of the sampled tokens' logprobs, or None when not computed
            (computed when `logprobs` is set, or for ranking when `best_of` > `n`).
        logprobs: per generated token, its logprobs dict; None unless `logprobs` was set.
        finish_reason: "stop", "length" or "abort"; None while running.
        stop_reason: the stop string or stop token id that ended it; None for EOS or length.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        """True once this sequence ended."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request, as returned by `LLM.generate` or streamed by the engine.

    Attributes:
        request_id: id.
        prompt: prompt text (None when the prompt was given as token ids).
        prompt_token_ids: prompt tokens.
        outputs: one CompletionOutput per sequence (`n` of them).
        finished: True once every sequence ended.
        prompt_logprobs: per prompt token, its logprobs dict (None for the first token);
            None unless `prompt_logprobs` was set.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    prompt_logprobs: PromptLogprobs | None = None

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, outputs={self.outputs}, "
            f"finished={self.finished})"
        )
