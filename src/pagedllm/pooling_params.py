"""PoolingParams: what a pooling request asks for (vLLM's names).

The pooling counterpart of SamplingParams: which task (embed, classify, score, encode,
reward), the embedding's Matryoshka `dimensions` and normalization, whether class logits go
through their activation, and how many prompt tokens to keep.
"""

from __future__ import annotations

from dataclasses import dataclass

POOLING_TASKS = ("embed", "classify", "score", "encode", "reward")


@dataclass
class PoolingParams:
    """Parameters of a pooling request.

    Attributes:
        task: embed, classify, score, encode (raw pooled states) or reward; None: set by
            the entry point that receives the request.
        dimensions: keep the first `dimensions` values of an embedding (Matryoshka models).
        normalize: L2-normalize embeddings (None: the model's default).
        activation: apply the classifier's activation (softmax, or sigmoid for one label)
            to its logits (None: the model's default).
        truncate_prompt_tokens: keep only the last k prompt tokens (-1: as many as
            max_model_len allows); None: a longer prompt is an error.
    """

    task: str | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    activation: bool | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(
                f"task must be one of {', '.join(POOLING_TASKS)}, got {self.task!r}."
            )
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be at least 1, got {self.dimensions}.")
        if self.truncate_prompt_tokens is not None and (
            self.truncate_prompt_tokens < -1 or self.truncate_prompt_tokens == 0
        ):
            raise ValueError(
                "truncate_prompt_tokens must be -1 or at least 1, got "
                f"{self.truncate_prompt_tokens}."
            )
        if self.dimensions is not None and self.task not in (None, "embed"):
            raise ValueError(f"dimensions applies to the embed task only, not {self.task!r}.")

    def verify(self, task: str, supported_tasks: tuple[str, ...]) -> PoolingParams:
        """These params for `task`, checked against what the model serves.

        Raises:
            ValueError: naming the task when the model does not serve it, or a field that
                does not apply to it.
        """
        if task not in supported_tasks:
            raise ValueError(
                f"This model does not support the {task!r} task; it serves: "
                f"{', '.join(supported_tasks) or 'none'}."
            )
        if self.task is not None and self.task != task:
            raise ValueError(f"task is {self.task!r} but the request is for {task!r}.")
        return PoolingParams(
            task, self.dimensions, self.normalize, self.activation, self.truncate_prompt_tokens
        )
