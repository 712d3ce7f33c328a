"""Speculative decoding's part in the step: after sampling, ask the proposer for the next
step's drafts of every request that sampled (spec_decode/proposers.py). Verifying them is
the sampling pipeline's ordinary work (worker/sampling.py), which reads the drafter's
distributions recorded here."""

from __future__ import annotations

import torch

from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.proposers import ProposalInputs, Proposer
from pagedllm.worker.input_batch import CachedRequestState
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.step_hooks.base import RunnerStep, StepHook


class SpecDecodeHook(StepHook):
    """Fills `output.spec_token_ids` with the proposer's drafts.

    Args:
        proposer: the drafter.
        config: speculative decoding's settings (the batch-size policy).
        draft_probs: request id → [drafts, vocab] the distribution its pending drafts were
            drawn from (shared with the sampling pipeline, which verifies against it).
    """

    def __init__(
        self, proposer: Proposer, config: SpeculativeConfig, draft_probs: dict[str, torch.Tensor]
    ) -> None:
        self.proposer = proposer
        self.config = config
        self.draft_probs = draft_probs

    def drop_requests(
        self, dropped: dict[str, CachedRequestState | None], swapped_out: set[int]
    ) -> None:
        """The proposer and the pending distributions forget them."""
        self.proposer.forget(list(dropped))
        for request_id in dropped:
            self.draft_probs.pop(request_id, None)

    def after_sampling(
        self, step: RunnerStep, hidden_states: torch.Tensor, output: ModelRunnerOutput
    ) -> None:
        """Drafts for the next step of every request that sampled in this one."""
        inputs = step.inputs
        propose_rows = list(inputs.sample_rows)
        if len(propose_rows) > self.config.max_batch_size:
            propose_rows = []  # a compute-bound batch: verifying costs what it saves
        num_kept = inputs.query_lens.copy()
        for row, drafts in zip(inputs.sample_rows, inputs.draft_token_ids, strict=True):
            emitted = output.sampled_token_ids[row]
            num_kept[row] -= len(drafts) - (len(emitted) - 1)  # the rejected drafts
        states = step.states
        proposal = self.proposer.propose(ProposalInputs(
            request_ids=inputs.request_ids,
            token_ids=[s.token_ids for s in states],
            context_lens=inputs.context_lens,
            num_kept=num_kept,
            query_start_loc=inputs.query_start_loc,
            block_tables=[s.block_ids[0] if s.block_ids else [] for s in states],
            sampling_params=[s.sampling_params for s in states],
            propose_rows=propose_rows,
            hidden_states=hidden_states,
            is_pooling=[s.pooling_params is not None for s in states],
        ))
        for row, drafts, probs in zip(propose_rows, proposal.drafts, proposal.probs, strict=True):
            request_id = inputs.request_ids[row]
            if drafts:
                output.spec_token_ids[request_id] = drafts
                if probs is not None:
                    self.draft_probs[request_id] = probs
