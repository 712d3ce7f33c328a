"""ModelPooler: a step's pooling requests → their pooled outputs (the runner's one call).

The step's hidden states are packed, every request's tokens back to back, and a pooling
request is computed whole in one step, so its rows are one contiguous span. Embed and encode
requests pool their span with the model's pooling type; classify, score and reward requests
go through the model's head (`classify(hidden_states, seq_lens)`). Each request's own
options then apply: Matryoshka `dimensions` and `normalize` for embeddings, `activation`
for class logits. Requests with the same options are finished in one batched operation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedllm.pooling.config import PoolerConfig
from pagedllm.pooling.data import PooledData
from pagedllm.pooling.pooler import finish_embedding, finish_scores, pool_hidden_states
from pagedllm.pooling_params import PoolingParams

# Tasks answered by the model's classification / score head rather than by pooling.
HEAD_TASKS = ("classify", "score", "reward")


@dataclass(frozen=True)
class PoolingSpan:
    """One pooling request's rows in the step's packed hidden states."""

    request_id: str
    start: int
    length: int
    params: PoolingParams


class ModelPooler:
    """Pools hidden states for the pooling requests of a step.

    Args:
        model: the model; needs `classify(hidden_states, seq_lens)` for head tasks.
        pooler_config: the resolved pooling setup (type, default normalize / softmax).
    """

    def __init__(self, model: torch.nn.Module, pooler_config: PoolerConfig) -> None:
        self.model = model
        self.config = pooler_config

    def __call__(
        self, hidden_states: torch.Tensor, input_ids: torch.Tensor, spans: Sequence[PoolingSpan]
    ) -> dict[str, PooledData]:
        """The pooled output of every span, by request id (float32 values)."""
        results: dict[str, torch.Tensor] = {}
        by_kind: dict[bool, list[PoolingSpan]] = defaultdict(list)
        for span in spans:
            by_kind[span.params.task in HEAD_TASKS].append(span)
        if by_kind[False]:
            results.update(self._pool(hidden_states, input_ids, by_kind[False]))
        if by_kind[True]:
            results.update(self._classify(hidden_states, by_kind[True]))
        return {request_id: to_pooled_data(value) for request_id, value in results.items()}

    def _pool(
        self, hidden_states: torch.Tensor, input_ids: torch.Tensor, spans: list[PoolingSpan]
    ) -> dict[str, torch.Tensor]:
        pooling_type = self.config.pooling_type or "LAST"
        # Only STEP pooling reads the input ids.
        packed_ids = _gather(input_ids, spans) if pooling_type == "STEP" else None
        pooled = pool_hidden_states(
            _gather(hidden_states, spans), [s.length for s in spans], pooling_type,
            packed_ids, self.config.step_tag_id,
        )  # fmt: skip
        groups: dict[tuple[int | None, bool], list[int]] = defaultdict(list)
        for index, span in enumerate(spans):
            groups[self._embedding_options(span.params)].append(index)
        results = {}
        for (dimensions, normalize), indices in groups.items():
            for index, value in zip(indices, _finish_embeddings(
                [pooled[i] for i in indices], dimensions, normalize
            ), strict=True):  # fmt: skip
                results[spans[index].request_id] = value
        return results

    def _embedding_options(self, params: PoolingParams) -> tuple[int | None, bool]:
        """(dimensions, normalize) of one embed / encode request."""
        dimensions = params.dimensions
        if dimensions is None and params.task == "embed":
            dimensions = self.config.dimensions
        default = bool(self.config.normalize) if params.task == "embed" else False
        return dimensions, default if params.normalize is None else params.normalize

    def _classify(
        self, hidden_states: torch.Tensor, spans: list[PoolingSpan]
    ) -> dict[str, torch.Tensor]:
        packed = _gather(hidden_states, spans)
        classify = getattr(self.model, "classify")  # noqa: B009 (a method of pooling models only)
        logits = classify(packed, [s.length for s in spans]).float()  # [N, L]
        results = {}
        for row, span in enumerate(spans):
            results[span.request_id] = self._activate(logits[row], span.params)
        return results

    def _activate(self, logits: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        """Class logits → probabilities (softmax; sigmoid for one label) when asked.

        On by default for classify and score (as vLLM and sentence-transformers' cross
        encoders); a reward is the raw score unless `activation=True`.
        """
        default = params.task != "reward"
        if params.task == "classify" and self.config.softmax is not None:
            default = self.config.softmax
        activate = default if params.activation is None else params.activation
        return finish_scores(logits, PoolerConfig(softmax=activate))


def _gather(values: torch.Tensor, spans: list[PoolingSpan]) -> torch.Tensor:
    """The spans' rows of `values`, packed back to back (no copy when they are all rows)."""
    if spans[0].start == 0 and _are_contiguous(spans) and _end(spans[-1]) == values.shape[0]:
        return values
    return torch.cat([values[s.start : _end(s)] for s in spans])


def _end(span: PoolingSpan) -> int:
    return span.start + span.length


def _are_contiguous(spans: list[PoolingSpan]) -> bool:
    return all(_end(a) == b.start for a, b in zip(spans, spans[1:], strict=False))


def _finish_embeddings(
    pooled: list[torch.Tensor], dimensions: int | None, normalize: bool
) -> list[torch.Tensor]:
    """Cut to `dimensions`, then L2-normalize if asked; one operation per same-shape batch."""
    config = PoolerConfig(normalize=normalize, dimensions=dimensions)
    if any(p.dim() != 1 for p in pooled):  # ALL / STEP: a matrix per request
        return [finish_embedding(p, config) for p in pooled]
    return list(finish_embedding(torch.stack(pooled), config).unbind(0))


def to_pooled_data(value: torch.Tensor) -> PooledData:
    """A float32 tensor as plain data for the trip to the frontend."""
    array = value.detach().float().contiguous().cpu().numpy()
    return PooledData(shape=list(array.shape), data=array.tobytes())


def from_pooled_data(data: PooledData) -> torch.Tensor:
    """The tensor of a PooledData (float32, sharing its bytes)."""
    values = torch.frombuffer(bytearray(data.data), dtype=torch.float32)
    return values.reshape(data.shape)
