"""The model runner's per-step hooks (base.py explains the places): one per capability,
registered by the worker at load."""

from pagedllm.worker.step_hooks.base import RunnerStep, StepHook

__all__ = ["RunnerStep", "StepHook"]
