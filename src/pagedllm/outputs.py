"""User-facing results with vLLM's fields: RequestOutput and CompletionOutput for generation;
PoolingRequestOutput and its embedding, classification and scoring views for pooling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:  # importing pagedllm must not import torch
    import torch
    from typing_extensions import Self


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
        finish_reason: "stop", "length", "abort" or "error" (the engine failed the request,
            e.g. non-finite logits); None while running.
        stop_reason: the stop string or stop token id that ended it; None for EOS or length.
        reasoning / content: `LLM.chat`'s split of `text` under the engine's reasoning
            parser (`reasoning_parser=`): the reasoning (None: none) and the answer; both
            None without a parser. `text` keeps the whole reply, as vLLM's does.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    reasoning: str | None = None
    content: str | None = None

    def finished(self) -> bool:
        """True once this sequence ended."""
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """When things happened to a request (vLLM's names; wall-clock seconds, time.time()).

    Attributes:
        arrival_time: the request reached the engine.
        first_scheduled_time: the scheduler first gave it a step (None before).
        first_token_time: its first output token reached the frontend (None before).
        last_token_time: its latest output token reached the frontend.
        time_in_queue: first_scheduled_time - arrival_time (None before it ran).
        finished_time: it finished (None while it runs).
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    time_in_queue: float | None = None
    finished_time: float | None = None


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
        num_cached_tokens: prompt tokens found in the prefix cache when it was first
            scheduled (None before that).
        metrics: its timings (a snapshot taken with this output).
        kv_transfer_params: what its KV connector reported when it finished (vLLM's; a
            prefill instance's answer carries where a decode instance finds its blocks).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int | None = None
    metrics: RequestMetrics | None = None
    kv_transfer_params: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, outputs={self.outputs}, "
            f"finished={self.finished})"
        )


@dataclass
class PoolingOutput:
    """A pooling model's raw output for one request: an embedding [H], class scores
    [num_labels], or per-token states [n, H] (vLLM's `PoolingOutput`)."""

    data: torch.Tensor


def _one_vector(output: PoolingOutput, what: str) -> list[float]:
    """The pooled output as a list of floats; ValueError unless it is one vector."""
    if output.data.dim() != 1:
        raise ValueError(f"{what} is one vector, got shape {tuple(output.data.shape)}.")
    return output.data.tolist()


@dataclass
class EmbeddingOutput:
    """An embedding as a list of floats (vLLM's `EmbeddingOutput`)."""

    embedding: list[float]

    @staticmethod
    def from_base(output: PoolingOutput) -> EmbeddingOutput:
        """The embedding view of a pooled output (ValueError unless one vector)."""
        return EmbeddingOutput(_one_vector(output, "An embedding"))

    @property
    def hidden_size(self) -> int:
        """The embedding's length."""
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    """Class probabilities (or logits without an activation) (vLLM's `ClassificationOutput`)."""

    probs: list[float]

    @staticmethod
    def from_base(output: PoolingOutput) -> ClassificationOutput:
        """The classification view of a pooled output (ValueError unless one vector)."""
        return ClassificationOutput(_one_vector(output, "Class scores"))

    @property
    def num_classes(self) -> int:
        """How many classes."""
        return len(self.probs)


@dataclass
class ScoringOutput:
    """One relevance score (vLLM's `ScoringOutput`)."""

    score: float

    @staticmethod
    def from_base(output: PoolingOutput) -> ScoringOutput:
        """The scoring view of a pooled output.

        Raises:
            ValueError: if the output is not a single value.
        """
        if output.data.numel() != 1:
            raise ValueError(f"A score is one value, got shape {tuple(output.data.shape)}.")
        return ScoringOutput(float(output.data.reshape(-1)[0]))


_O = TypeVar("_O", PoolingOutput, EmbeddingOutput, ClassificationOutput, ScoringOutput)


@dataclass
class PoolingRequestOutput(Generic[_O]):
    """The result of one pooling request (vLLM's `PoolingRequestOutput`); the embedding,
    classification and scoring request outputs are its views.

    Attributes:
        request_id: id.
        outputs: the pooled output, in this view's form.
        prompt_token_ids: the prompt tokens that were pooled (after any truncation).
        finished: always True (a pooling request is computed in one piece).
    """

    request_id: str
    outputs: _O
    prompt_token_ids: list[int]
    finished: bool = True


class _PoolingView(PoolingRequestOutput[_O]):
    """A view of a pooling request's output: `from_base` converts its `outputs` with the
    view's output class (`output_class.from_base`)."""

    output_class: ClassVar[Any]

    @classmethod
    def from_base(cls, output: PoolingRequestOutput[PoolingOutput]) -> Self:
        """This view of a pooling request's output."""
        return cls(
            output.request_id, cls.output_class.from_base(output.outputs),
            output.prompt_token_ids, output.finished,
        )  # fmt: skip


class EmbeddingRequestOutput(_PoolingView[EmbeddingOutput]):
    """`LLM.embed`'s result."""

    output_class = EmbeddingOutput


class ClassificationRequestOutput(_PoolingView[ClassificationOutput]):
    """`LLM.classify`'s result."""

    output_class = ClassificationOutput


class ScoringRequestOutput(_PoolingView[ScoringOutput]):
    """`LLM.score`'s result."""

    output_class = ScoringOutput
