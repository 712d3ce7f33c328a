"""StepHook: one capability plugged into the model runner's step, and the step it sees.

The worker registers the hooks its configuration asks for once, at load; the runner calls
every hook at each place of a step, in registration order. A hook reads the step (its
inputs, the request states, the scheduler's output) and writes its own fields of the
`ModelRunnerOutput`; it never touches another hook's state or the scheduler's. A new
per-step capability is a new hook, not a branch in the runner.

The places, in step order:
- `add_request` / `drop_requests`: the batch changes (new or resumed requests; finished,
  preempted or swapped-out ones).
- `on_empty_step`: a step with nothing to compute (only finished requests to drop, or a
  KV connector's transfers to poll); no other place is called then.
- `before_forward`: before the model runs (LoRA groups the step's tokens by adapter; a KV
  connector starts loading remote KV here, and an encoder runs and fills its cache).
- `after_forward`: the final hidden states are there, the sampled tokens are not yet in
  the states (pooled outputs; prompt logprobs; a KV connector waits for its saves here).
- `after_sampling`: the step's tokens are in the states (drafts for the next step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedllm.core.sched_output import NewRequestData, SchedulerOutput
from pagedllm.models.interfaces import MultiModalEmbeddings
from pagedllm.worker.input_batch import CachedRequestState, StepInputs
from pagedllm.worker.outputs import ModelRunnerOutput


@dataclass
class RunnerStep:
    """One step as hooks see it.

    Attributes:
        scheduler_output: what the scheduler asked for.
        inputs: the flattened batch (host arrays).
        states: the request state of every batch row, in batch order.
        to_device: a host array as a tensor on the model's device.
        mm_embeds: encoder outputs for the step's image tokens (set before the forward
            by the multimodal hook), or None.
        key_ends: [T] each token's exclusive bound on the key positions it attends, where
            an image's tokens attend to each other both ways (set by the multimodal hook;
            attention/backend.py `key_ends`), or None: causal.
        rope_positions: the positions the model rotates by, where they are not the
            tokens' indices ([3, T] for an M-RoPE model's step with images; set by the
            multimodal hook), or None.
    """

    scheduler_output: SchedulerOutput
    inputs: StepInputs
    states: Sequence[CachedRequestState]
    to_device: Callable[[np.ndarray], torch.Tensor]
    mm_embeds: MultiModalEmbeddings | None = None
    key_ends: np.ndarray | None = None
    rope_positions: np.ndarray | None = None


class StepHook:
    """A capability's part in the runner's step; every place is optional (no-op here)."""

    # False for a hook with nothing to do on a further decode step of the same requests
    # (a multi-step's greedy loop, worker/multi_step.py, runs those without the hooks).
    per_step = True

    def add_request(self, state: CachedRequestState, new: NewRequestData) -> None:
        """A request joins the batch (new, or resumed after a preemption)."""

    def drop_requests(
        self, dropped: dict[str, CachedRequestState | None], swapped_out: set[int]
    ) -> None:
        """Requests leave the batch: their states (None for one the runner did not hold:
        it ended while swapped out), and the device blocks swapped out this step."""

    def on_empty_step(self, scheduler_output: SchedulerOutput,
                      output: ModelRunnerOutput) -> None:
        """A step with no tokens to compute (a KV connector polls its transfers)."""

    def before_forward(self, step: RunnerStep) -> None:
        """Before the model (or a decode-step fast path) runs."""

    def after_forward(
        self, step: RunnerStep, hidden_states: torch.Tensor, output: ModelRunnerOutput
    ) -> None:
        """After the forward, before sampling: `hidden_states` [T, hidden] of the batch."""

    def after_sampling(
        self, step: RunnerStep, hidden_states: torch.Tensor, output: ModelRunnerOutput
    ) -> None:
        """After sampling: `output.sampled_token_ids` are in the states."""
