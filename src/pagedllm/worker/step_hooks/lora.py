"""LoRA's part in the step: group the step's tokens by adapter before the forward (the
layers' adapter slots read that grouping, lora/layers.py)."""

from __future__ import annotations

import torch

from pagedllm.lora.manager import LoRAModelManager
from pagedllm.worker.step_hooks.base import RunnerStep, StepHook


class LoRAHook(StepHook):
    """Slots the step's adapters and groups its tokens by slot (lora/manager.py)."""

    def __init__(self, manager: LoRAModelManager, device: torch.device) -> None:
        self.manager = manager
        self.device = device

    def before_forward(self, step: RunnerStep) -> None:
        """Every row's adapter (or none) and token count, in batch order."""
        rows = [
            (state.lora_request, int(count))
            for state, count in zip(step.states, step.inputs.query_lens, strict=True)
        ]
        self.manager.prepare_step(rows, self.device)
