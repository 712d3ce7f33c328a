"""Prompt logprobs' part in the step: score the prompt positions each step computes,
accumulate them over chunks, and send them once the prompt is done.

The scores are the model's raw distribution (log_softmax of the logits) at every prompt
position that predicts a prompt token (worker/logprobs.py plans which). A request swapped
out mid-prompt parks what it accumulated until it is swapped back in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pagedllm.core.sched_output import NewRequestData
from pagedllm.layers.logprobs import compute_token_logprobs
from pagedllm.worker.input_batch import CachedRequestState
from pagedllm.worker.logprobs import (
    concat_token_logprobs,
    plan_prompt_logprobs,
    resolve_num_top,
    split_logprobs,
)
from pagedllm.worker.outputs import LogprobsLists, ModelRunnerOutput
from pagedllm.worker.step_hooks.base import RunnerStep, StepHook

if TYPE_CHECKING:
    from pagedllm.models.interfaces import CausalLM

# Prompt positions scored per logits computation: bounds the [M, vocab] float32 temporaries.
_PROMPT_LOGPROBS_CHUNK = 256


class PromptLogprobsHook(StepHook):
    """Fills `output.prompt_logprobs` for the requests whose prompt completes this step."""

    per_step = False  # a decode step has no prompt positions

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        # Prompt logprobs of requests swapped out mid-prompt, until they are swapped back in.
        self.parked: dict[str, LogprobsLists] = {}

    def add_request(self, state: CachedRequestState, new: NewRequestData) -> None:
        """Start (or resume) the request's accumulator when it asks for prompt logprobs."""
        parked = self.parked.pop(new.request_id, None)
        if new.data.sampling_params.prompt_logprobs is None or new.output_token_ids:
            return  # not asked for, or already sent before a preemption
        num_scored = min(new.num_computed_tokens, len(new.data.prompt_token_ids) - 1)
        if parked is not None and len(parked) == num_scored:
            state.in_progress_prompt_logprobs = parked  # swapped back in mid-prompt
            return
        # Positions already computed elsewhere (a prefix-cache hit, which
        # skip_reading_prefix_cache prevents) cannot be scored; the frontend leaves them None.
        state.in_progress_prompt_logprobs = LogprobsLists()

    def drop_requests(
        self, dropped: dict[str, CachedRequestState | None], swapped_out: set[int]
    ) -> None:
        """Park a swapped-out request's accumulator; forget the others'."""
        for request_id, state in dropped.items():
            if state is None:  # ended while swapped out: never resumed
                self.parked.pop(request_id, None)
            elif state.in_progress_prompt_logprobs is not None and any(
                swapped_out.intersection(table) for table in state.block_ids
            ):  # only a swapped-out request comes back with its computed tokens
                self.parked[request_id] = state.in_progress_prompt_logprobs

    def after_forward(
        self, step: RunnerStep, hidden_states: torch.Tensor, output: ModelRunnerOutput
    ) -> None:
        """Score this step's prompt positions; send the prompts completed this step."""
        plan = plan_prompt_logprobs(step.inputs, step.states)
        if plan is None:
            return
        num_scored = len(plan.hidden_indices)
        results = []
        vocab_size = 0
        for start in range(0, num_scored, _PROMPT_LOGPROBS_CHUNK):
            end = min(start + _PROMPT_LOGPROBS_CHUNK, num_scored)
            index = step.to_device(plan.hidden_indices[start:end])
            logits = self.model.compute_logits(hidden_states[index])  # [m, vocab]
            vocab_size = logits.shape[-1]
            max_top = max(resolve_num_top(n, vocab_size) for n in plan.num_logprobs)
            targets = step.to_device(plan.target_ids[start:end])  # [m]
            results.append(compute_token_logprobs(logits, targets, max_top))
        num_top = [resolve_num_top(n, vocab_size) for n in plan.num_logprobs]
        if results:
            lists = split_logprobs(concat_token_logprobs(results), plan.num_positions, num_top)
        else:  # only prompts of one token, or chunks ending at the last prompt token
            lists = [LogprobsLists() for _ in plan.rows]
        for row, scored, is_complete in zip(plan.rows, lists, plan.is_complete, strict=True):
            state = step.states[row]
            accumulated = state.in_progress_prompt_logprobs
            assert accumulated is not None
            accumulated.extend(scored)
            if is_complete:
                output.prompt_logprobs[state.request_id] = accumulated
                state.in_progress_prompt_logprobs = None
