"""The runner's side of a KV connector: its loads before each forward and its saves after
it (distributed/kv_transfer/; the scheduler half plans them in `kv_connector_metadata`)."""

from __future__ import annotations

from typing import Any

import torch

from pagedllm.worker.step_hooks.base import RunnerStep, StepHook


class KVConnectorHook(StepHook):
    """Runs the connector's worker half around the forward.

    Args:
        connector: the connector's worker half, its caches registered.
    """

    def __init__(self, connector: Any) -> None:
        self.connector = connector

    def before_forward(self, step: RunnerStep) -> None:
        """Bring in the blocks this step reads but did not compute."""
        self.connector.start_load_kv(step.scheduler_output.kv_connector_metadata)

    def after_forward(self, step: RunnerStep, hidden_states: torch.Tensor, output: Any) -> None:
        """Send out the blocks this step computed."""
        self.connector.wait_for_save(step.scheduler_output.kv_connector_metadata)

    def after_sampling(self, step: RunnerStep, hidden_states: torch.Tensor, output: Any) -> None:
        """A request whose blocks failed to load emits nothing and fails (the scheduler
        ends it with an error and takes its blocks out of the prefix cache)."""
        output.kv_transfer = self.connector.take_transfer_counts()
        failed = self.connector.get_load_failures()
        for row, request_id in enumerate(output.request_ids):
            if request_id in failed:
                output.sampled_token_ids[row] = []
                output.logprobs.pop(request_id, None)
                output.failed_request_ids.append(request_id)
