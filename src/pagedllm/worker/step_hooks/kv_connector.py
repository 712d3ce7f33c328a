"""The runner's side of a KV connector: its loads before each forward and its saves after
it, and the news of its asynchronous transfers after every step, empty ones included
(distributed/kv_transfer/; the scheduler half plans them in `kv_connector_metadata`)."""

from __future__ import annotations

from typing import Any

import torch

from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.distributed.kv_transfer.base import KVConnectorOutput
from pagedllm.worker.input_batch import CachedRequestState
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.step_hooks.base import RunnerStep, StepHook


class KVConnectorHook(StepHook):
    """Runs the connector's worker half around the forward.

    Args:
        connector: the connector's worker half, its caches registered.
    """

    def __init__(self, connector: Any) -> None:
        self.connector = connector

    def drop_requests(
        self, dropped: dict[str, CachedRequestState | None], swapped_out: set[int]
    ) -> None:
        """Ended requests' blocks may be another's this step: no late load writes them."""
        self.connector.cancel_loads(set(dropped))

    def on_empty_step(self, scheduler_output: SchedulerOutput,
                      output: ModelRunnerOutput) -> None:
        """Nothing computes: start this step's loads, report the finished transfers."""
        self.connector.start_load_kv(scheduler_output.kv_connector_metadata)
        self.connector.wait_for_save(scheduler_output.kv_connector_metadata)
        self._report(scheduler_output, output)

    def before_forward(self, step: RunnerStep) -> None:
        """Bring in the blocks this step reads but did not compute."""
        self.connector.start_load_kv(step.scheduler_output.kv_connector_metadata)

    def after_forward(self, step: RunnerStep, hidden_states: torch.Tensor, output: Any) -> None:
        """Send out the blocks this step computed."""
        self.connector.wait_for_save(step.scheduler_output.kv_connector_metadata)

    def after_sampling(self, step: RunnerStep, hidden_states: torch.Tensor, output: Any) -> None:
        """A request whose blocks failed to load emits nothing (the scheduler fails it, or
        has it compute them itself, as kv_load_failure_policy says)."""
        news = self._report(step.scheduler_output, output)
        for row, request_id in enumerate(output.request_ids):
            if request_id in news.failed_recving:
                output.sampled_token_ids[row] = []
                output.logprobs.pop(request_id, None)

    def _report(self, scheduler_output: SchedulerOutput,
                output: ModelRunnerOutput) -> KVConnectorOutput:
        """The step's traffic and finished or failed transfers onto `output`."""
        sending, recving = self.connector.get_finished(scheduler_output.finished_request_ids)
        news = KVConnectorOutput(sending or set(), recving or set(),
                                 self.connector.get_load_failures())
        output.kv_connector_output = news if news else None
        # After get_finished: the loads it completes count in this step's traffic.
        output.kv_transfer = self.connector.take_transfer_counts()
        return news
