"""User-facing results: RequestOutput and CompletionOutput, with vLLM's fields."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    Attributes:
        index: which of the request's `n` sequences this is.
        text: generated text (stop string excluded unless include_stop_str_in_output).
        token_ids: generated token ids.
        cumulative_logprob: sum of the sampled tokens' logprobs, or None when not computed.
        finish_reason: "stop", "length" or "abort"; None while running.
        stop_reason: the stop string or stop token id that ended it; None for EOS or length.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list | None = None
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
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    prompt_logprobs: list | None = None

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, outputs={self.outputs}, "
            f"finished={self.finished})"
        )
