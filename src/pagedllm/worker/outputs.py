"""ModelRunnerOutput: the worker's answer to a SchedulerOutput, as Python lists only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelRunnerOutput:
    """Tokens sampled in one step.

    Attributes:
        request_ids: every request scheduled this step, in batch order.
        sampled_token_ids: per request, the tokens sampled this step; empty for a request
            whose prompt is still being prefilled in chunks.
    """

    request_ids: list[str]
    sampled_token_ids: list[list[int]]
