"""Multi-step scheduling: several decode steps per scheduler step (vLLM V0's
`num_scheduler_steps`).

A batch-1 decode step on a CPU spends a sizeable share of its time outside the model:
scheduling, its stats, the output processing and the engine's own loop. While every
running request only decodes and nothing waits for a seat, none of that changes the next
step, so the scheduler lets the runner take up to `num_scheduler_steps` steps in a row:

- `steps_for` decides a step's count: 1 unless every running request is a plain decode
  (no grammar, logprobs, drafts or pooling) and no waiting request could take a free seat;
  never past any request's max_tokens or the model's length;
- each request's blocks cover the extra steps (lookahead slots, allocated with its token);
- the runner decodes each request's newly sampled token in the next step and returns every
  token it sampled (worker/multi_step.py);
- `MultiStepAdvance` counts the positions the extra steps computed before the tokens are
  appended through the stop checks, which cut a request's tokens at its stop as always;
  slots a step did not use go back as a drafter's do (post_step.py's LookaheadRelease).

Outputs are the same tokens as one step at a time; only their grouping changes. The runner
ends a group at the first stop token a row samples (worker/multi_step.py); a stop string,
which needs text, is found only after the group.

`num_scheduler_steps=None`, the default, groups AUTO_SCHEDULER_STEPS steps only when every
running request asked for its final output alone (`RequestOutputKind.FINAL_ONLY`: the
offline `LLM`'s requests): nobody sees its tokens before it ends, so grouping changes
nothing it could observe but the time. A streamed request keeps one token a step, as vLLM's
default does, and an online engine (AsyncLLM, the server) takes 1 (config.py's
for_online_serving: a request arriving during a group would wait for it); an explicit N
groups every plain decode (vLLM V0). A group whose lookahead slots do not fit in the free
blocks runs as one step (Scheduler._group_fits), so grouping makes no preemption sooner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagedllm.core.post_step import PostStepProcessor
from pagedllm.request import Request
from pagedllm.sampling_params import RequestOutputKind

# The steps a scheduler step groups by default (num_scheduler_steps=None) for requests whose
# output is final only: measured to bring a single stream's host time per token from 12-16%
# of a step to 5-6% (BENCHMARKS.md, multi-step scheduling).
AUTO_SCHEDULER_STEPS = 8


class MultiStepPolicy:
    """How many decode steps a scheduler step takes.

    Args:
        num_steps: SchedulerConfig.num_scheduler_steps (1: multi-step off; None: automatic,
            AUTO_SCHEDULER_STEPS for batches whose every request's output is final only).
        max_model_len: the longest a request may grow.
    """

    def __init__(self, num_steps: int | None, max_model_len: int) -> None:
        self.num_steps = num_steps
        self.max_model_len = max_model_len

    @property
    def enabled(self) -> bool:
        """True when steps may be grouped."""
        return self.num_steps != 1

    def steps_for(self, running: Sequence[Request], admits_others: Callable[[], bool]) -> int:
        """The steps for a batch of `running` requests; 1 when a request is not a plain
        decode (or, automatic, streams its output), or when `admits_others()` (a waiting
        request could start this step; asked only with multi-step on: one step at a time,
        the scheduler's step skips it)."""
        if not self.enabled or not running:
            return 1
        if self.num_steps is None and not all(final_only(request) for request in running):
            return 1
        if admits_others():
            return 1
        steps = self.num_steps or AUTO_SCHEDULER_STEPS
        for request in running:
            if not runs_multi_step(request):
                return 1
            steps = min(steps, request.max_tokens - request.num_output_tokens,
                        self.max_model_len - request.num_tokens)
        return max(1, steps)

    @staticmethod
    def lookahead(num_steps: int) -> int:
        """KV slots a request needs past its scheduled token for `num_steps` steps."""
        return num_steps - 1


def final_only(request: Request) -> bool:
    """True when the request's caller takes only its final output (no stream)."""
    return request.sampling_params.output_kind == RequestOutputKind.FINAL_ONLY


def runs_multi_step(request: Request) -> bool:
    """True when `request` decodes (one token left to compute) and samples plainly: no
    grammar (its bitmask changes every token), no logprobs, no drafts, not pooling."""
    return (
        request.num_tokens - request.num_computed_tokens == 1
        and not request.is_pooling
        and request.structured_output is None
        and request.sampling_params.logprobs is None
        and not request.spec_token_ids
    )


class MultiStepAdvance(PostStepProcessor):
    """The extra steps computed the positions of every returned token but the last: they
    count as computed before the tokens are appended. (Lookahead slots a step did not use,
    when it ran fewer steps than its blocks were allocated for, go back through
    post_step.py's LookaheadRelease, after this.)"""

    def before_append(self, request: Request, token_ids: list[int], num_drafts: int) -> None:
        """Advance past the positions the runner's extra steps computed."""
        if not num_drafts and len(token_ids) > 1:
            request.num_computed_tokens += len(token_ids) - 1
