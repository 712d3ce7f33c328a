"""Pooling's part in the step: the pooled outputs of the step's pooling requests, from the
final hidden states (pooling/model_pooler.py)."""

from __future__ import annotations

import torch

from pagedllm.pooling.model_pooler import ModelPooler, PoolingSpan
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.step_hooks.base import RunnerStep, StepHook


class PoolingHook(StepHook):
    """Pools every pooling row (computed whole this step) into `output.pooler_output`."""

    def __init__(self, pooler: ModelPooler) -> None:
        self.pooler = pooler

    def after_forward(
        self, step: RunnerStep, hidden_states: torch.Tensor, output: ModelRunnerOutput
    ) -> None:
        """Each pooling row's span of the batch, with its request's pooling parameters."""
        inputs = step.inputs
        if not inputs.pooling_rows:
            return
        spans = [
            PoolingSpan(
                inputs.request_ids[row],
                int(inputs.query_start_loc[row]),
                int(inputs.query_lens[row]),
                step.states[row].pooling_params,  # type: ignore[arg-type]
            )
            for row in inputs.pooling_rows
        ]
        input_ids = step.to_device(inputs.input_ids)
        output.pooler_output = self.pooler(hidden_states, input_ids, spans)
