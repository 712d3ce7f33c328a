"""The runner's side of multi-step scheduling (core/multi_step.py).

A scheduler step with `num_steps` > 1 only continues running requests, one token each,
and their blocks already hold the slots of the steps after the first. The runner takes
the first step as scheduled, then each extra step as a decode-only step it writes itself:
every request computes the token it sampled in the step before, one position further. The
tokens of all the steps go back together, in the first step's order.
"""

from __future__ import annotations

from collections.abc import Callable

from pagedllm.core.sched_output import CachedRequestData, SchedulerOutput
from pagedllm.worker.outputs import ModelRunnerOutput


def run_extra_steps(
    execute: Callable[[SchedulerOutput], ModelRunnerOutput],
    first: SchedulerOutput,
    output: ModelRunnerOutput,
) -> ModelRunnerOutput:
    """Run `first`'s steps after the first (whose `output` is given) through `execute`,
    and return every step's tokens merged into `output`. A step where a request failed
    (non-finite) is the last: the scheduler ends that request, the others go on later."""
    for step in range(1, first.num_steps):
        if output.failed_request_ids:
            break
        merge_step(output, execute(extra_step(first, step)))
    return output


def extra_step(first: SchedulerOutput, step: int) -> SchedulerOutput:
    """The `step`-th step after `first` (1-based): the same requests, each one position
    further, no new blocks, nothing to drop."""
    cached = first.scheduled_cached_reqs
    assert not first.scheduled_new_reqs and cached.num_requests == len(
        first.num_scheduled_tokens
    ), "multi-step runs only requests the runner holds"
    return SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(
            request_ids=cached.request_ids,
            new_block_ids=[tuple([] for _ in ids) for ids in cached.new_block_ids],
            num_computed_tokens=[count + step for count in cached.num_computed_tokens],
        ),
        num_scheduled_tokens=first.num_scheduled_tokens,
        total_num_scheduled_tokens=first.total_num_scheduled_tokens,
        finished_request_ids=set(),
    )


def merge_step(output: ModelRunnerOutput, step: ModelRunnerOutput) -> None:
    """Append a later step's tokens (same requests, same order) and failures to `output`."""
    assert step.request_ids == output.request_ids
    for tokens, more in zip(output.sampled_token_ids, step.sampled_token_ids, strict=True):
        tokens.extend(more)
    output.failed_request_ids.extend(step.failed_request_ids)
