"""The runner's side of multi-step scheduling (core/multi_step.py).

A scheduler step with `num_steps` > 1 only continues running requests, one token each,
and their blocks already hold the slots of the steps after the first. The runner takes
the first step as scheduled, then each extra step as a decode-only step it writes itself:
every request computes the token it sampled in the step before, one position further. The
tokens of all the steps go back together, in the first step's order.

The steps go one of two ways:
- `GreedyDecodeLoop`: plain greedy rows on the platform's decode-step fast path, with no
  hook that acts on a decode step. The loop takes the whole scheduler step, the first step
  too (ModelRunner._greedy_steps; a step of one decode step alike): the CPU stack all of
  them in one C call (csrc/decode_loop.c: the stack, the LM head's greedy tail, the argmax
  fed back); another fast path each as its forward and the LM head's argmax. No input
  preparation, sampling pipeline or hooks: on a CPU the host's work between two kernel
  calls after the weights went through the caches costs ~0.1-0.2 ms;
- otherwise the runner takes the first step as scheduled and each extra step as its whole
  step (`extra_step` writes its SchedulerOutput), for any sampling the scheduler lets take
  several steps (the loop takes the extra ones where it serves them).

Either way the steps end with the first that samples a token ending a request (`StopTokens`:
its EOS, its stop token ids): nothing is computed past a request's end that the stop checks
would then throw away, and its seat frees at once. A stop string is found after the group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from pagedllm.core.sched_output import CachedRequestData, SchedulerOutput
from pagedllm.logger import init_logger
from pagedllm.worker.block_table import compute_slot_mapping, group_block_tables
from pagedllm.worker.decode_step.base import DecodeBatch, DecodeStep
from pagedllm.worker.input_batch import CachedRequestState
from pagedllm.worker.outputs import ModelRunnerOutput

if TYPE_CHECKING:
    from pagedllm.core.kv_cache_groups import KVCacheGroupSpec
    from pagedllm.models.interfaces import CausalLM

logger = init_logger(__name__)


@dataclass
class StopTokens:
    """Each row's tokens that end its request at its next token: its EOS (unless ignored)
    and its stop token ids, once that token meets its min_tokens (a row that meets them
    later in the group is checked after it, by the engine).

    Attributes:
        table: [rows, width] int64, -1 where a row has fewer; None when no row has any.
    """

    table: np.ndarray | None

    @classmethod
    def of(cls, states: Sequence[CachedRequestState]) -> StopTokens:
        """The stop tokens of `states`' rows, each holding its latest token."""
        rows: list[list[int]] = []
        for state in states:
            params = state.sampling_params
            ids: list[int] = []
            if state.num_output_tokens + 1 >= params.min_tokens:
                if not params.ignore_eos and state.eos_token_id is not None:
                    ids.append(state.eos_token_id)
                ids.extend(params.stop_token_ids or ())
            rows.append(ids)
        width = max((len(ids) for ids in rows), default=0)
        if width == 0:
            return cls(None)
        table = np.full((len(rows), width), -1, dtype=np.int64)
        for row, ids in enumerate(rows):
            table[row, : len(ids)] = ids
        return cls(table)

    def hit(self, tokens: Sequence[int]) -> bool:
        """Whether a row's token (one a row) is one of its stop tokens."""
        table = self.table
        if table is None:
            return False
        return bool((table == np.asarray(tokens, dtype=np.int64)[:, None]).any())


def run_extra_steps(
    execute: Callable[[SchedulerOutput], ModelRunnerOutput],
    first: SchedulerOutput,
    output: ModelRunnerOutput,
    loop: GreedyDecodeLoop | None,
    stops: StopTokens,
    done: int = 1,
) -> ModelRunnerOutput:
    """Run `first`'s steps after the first (whose `output` is given), through `loop` while
    it serves them, then through `execute`, and return every step's tokens merged into
    `output`. A step where a request failed (non-finite), or where a row sampled one of
    its `stops`, is the last: the scheduler ends that request, the others go on later.
    `done`: the steps `output` holds already (the first, or more where the loop took the
    whole step: ModelRunner._greedy_steps)."""
    if not output.failed_request_ids and not stops.hit(_last_tokens(output)):
        if loop is not None:
            done += loop.run(first.num_steps - done, output, stops)
        while done < first.num_steps and not output.failed_request_ids:
            if stops.hit(_last_tokens(output)):
                break
            merge_step(output, execute(extra_step(first, done)))
            done += 1
    return output


def _last_tokens(output: ModelRunnerOutput) -> list[int]:
    """Each row's latest token (-1 for a row that sampled none)."""
    return [tokens[-1] if tokens else -1 for tokens in output.sampled_token_ids]


@dataclass
class GreedyDecodeLoop:
    """A multi-step's extra steps for plain greedy requests on a decode-step fast path:
    all of them in one call where the path takes them so (the CPU stack: csrc/
    decode_loop.c), else each step as the fast path's forward and the LM head's argmax of
    every row. The tokens join the requests' states as the runner's own step appends them.

    Attributes:
        states: the step's requests, in batch order (they hold the first step's token).
        decode_step: the platform's decode-step fast path.
        model: the causal LM (its `compute_greedy_tokens` and `greedy_tail`).
        block_size: tokens per KV block.
        groups: the model's KV cache groups (a windowed model's sliding-window layers
            keep their own block table).
    """

    states: list[CachedRequestState]
    decode_step: DecodeStep
    model: CausalLM
    block_size: int
    groups: Sequence[KVCacheGroupSpec]

    def run(self, num_steps: int, output: ModelRunnerOutput, stops: StopTokens) -> int:
        """Take up to `num_steps` steps, from each request's latest token, while the fast
        path serves them, up to the first that samples one of `stops`; the number taken,
        a failed one included (the rest go through the runner's step). A failed row in
        the first step leaves that step to the runner (0 taken, nothing appended or
        failed: the runner's own step computes it again and fails the row as ever)."""
        states = self.states
        base = np.array([len(s.token_ids) - 1 for s in states], dtype=np.int64)
        # The scheduler appended each request's blocks (a multi-step's lookahead ones too);
        # the first step's windows hold for the later ones (a window only moves forward,
        # and the scheduler frees nothing during the group).
        tables = group_block_tables([s.block_ids for s in states],
                                    [g.sliding_window for g in self.groups], base,
                                    self.block_size)
        rows = np.arange(len(states))
        taken = 0
        while taken < num_steps:
            positions = base + taken
            slots = [compute_slot_mapping(table, rows, positions, self.block_size)
                     for table in tables]
            input_ids = np.array([s.token_ids[-1] for s in states], dtype=np.int64)
            batch = DecodeBatch(input_ids, positions, slots[0], tables[0],
                                tuple(zip(slots[1:], tables[1:], strict=True)))
            if not self.decode_step.serves(batch):
                break
            steps = self._forward(batch, num_steps - taken, stops)
            for tokens in steps:
                if min(tokens) < 0:
                    if taken == 0:
                        return 0
                    _fail(output, [i for i, t in enumerate(tokens) if t < 0])
                    return taken + 1
                taken += 1
                self._append(tokens, output)
                if stops.hit(tokens):
                    return taken
        return taken

    def _forward(self, batch: DecodeBatch, steps: int, stops: StopTokens) -> list[list[int]]:
        """The tokens of up to `steps` steps from `batch`: all of them in one call where
        the fast path takes them so (ending at a step that samples one of `stops`), else
        one step's."""
        together = self.decode_step.greedy_steps(batch, steps, self.model, stops.table)
        if together is not None:
            return together
        hidden = self.decode_step.run(batch)
        return [cast("list[int]", self.model.compute_greedy_tokens(hidden).tolist())]

    def _append(self, tokens: list[int], output: ModelRunnerOutput) -> None:
        """A step's tokens, one a request, into the states and the output."""
        for state, token_id, sampled in zip(
            self.states, tokens, output.sampled_token_ids, strict=True
        ):
            state.num_computed_tokens += 1
            state.token_ids.append(token_id)
            sampled.append(token_id)


def _fail(output: ModelRunnerOutput, rows: list[int]) -> None:
    """Rows whose forward went non-finite: their requests fail (as the runner's own step
    fails them), keeping the tokens of the steps before (the scheduler takes those)."""
    for row in rows:
        output.failed_request_ids.append(output.request_ids[row])
    logger.warning("Non-finite logits: failing request(s) %s.", output.failed_request_ids)


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
    # The scheduler gives several steps only to requests that need none of these.
    assert not (step.logprobs or step.prompt_logprobs or step.pooler_output
                or step.spec_token_ids or step.kv_connector_output), "not a plain step"
    for tokens, more in zip(output.sampled_token_ids, step.sampled_token_ids, strict=True):
        tokens.extend(more)
    output.failed_request_ids.extend(step.failed_request_ids)
