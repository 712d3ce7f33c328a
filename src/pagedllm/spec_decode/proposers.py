"""What proposers read after a step, and the proposer `speculative_config.method` asks for.

The model runner hands every proposer the same `ProposalInputs`: the step's rows with their
tokens, block tables and what of the step's query was kept (rejected drafts excluded), the
target's hidden states, and which rows to propose for. A proposer answers with draft tokens
per proposing row and, when it sampled them from a distribution of its own, that
distribution (for the rejection sampler).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from pagedllm.sampling_params import SamplingParams
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.ngram_proposer import NgramProposer

if TYPE_CHECKING:
    from pagedllm.attention.backend import AttentionBackend


@dataclass
class ProposalInputs:
    """A finished step, as proposers see it (rows in batch order).

    Attributes:
        request_ids: every row of the step.
        token_ids: per row, its tokens so far (this step's emitted tokens included).
        context_lens: [rows] tokens in the KV cache before the step.
        num_kept: [rows] tokens of the step's query whose KV and hidden states stand (all of
            them, minus the rejected drafts).
        query_start_loc: [rows + 1] where each row's query starts in the batch.
        block_tables: per row, its block table (KV cache group 0).
        sampling_params: per row.
        propose_rows: the rows to propose for (they sampled; the batch-size policy holds).
        hidden_states: [T, hidden] the target's final hidden states of the step.
        is_pooling: per row, a pooling request (never proposed for, no tokens).
    """

    request_ids: list[str]
    token_ids: list[list[int]]
    context_lens: np.ndarray
    num_kept: np.ndarray
    query_start_loc: np.ndarray
    block_tables: list[list[int]]
    sampling_params: list[SamplingParams]
    propose_rows: list[int]
    hidden_states: torch.Tensor
    is_pooling: list[bool] | None = None

    def last_hidden_index(self, row: int) -> int:
        """The batch token whose logits gave the row's last emitted token."""
        return int(self.query_start_loc[row] + self.num_kept[row] - 1)


@dataclass
class Proposal:
    """Draft tokens per proposing row, and the drafter's distribution where it sampled.

    Attributes:
        drafts: per propose row (in `propose_rows` order), its draft tokens (maybe none).
        probs: per propose row, [len(drafts), vocab] the distribution each draft was drawn
            from, or None where the drafts are deterministic (argmax, lookups).
    """

    drafts: list[list[int]]
    probs: list[torch.Tensor | None]


class Proposer(Protocol):
    """Proposes draft tokens after a step."""

    def propose(self, inputs: ProposalInputs) -> Proposal:
        """Drafts for `inputs.propose_rows`."""
        ...

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop the state of finished or preempted requests."""
        ...


class NgramLookup:
    """The n-gram proposer behind the `Proposer` interface."""

    def __init__(self, config: SpeculativeConfig) -> None:
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        self.ngram = NgramProposer(
            config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max
        )

    def propose(self, inputs: ProposalInputs) -> Proposal:
        """Drafts looked up in each proposing row's own tokens."""
        rows = inputs.propose_rows
        drafts = self.ngram.propose(
            [inputs.request_ids[r] for r in rows], [inputs.token_ids[r] for r in rows]
        )
        return Proposal(drafts, [None] * len(drafts))

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop the requests' token buffers."""
        self.ngram.forget(request_ids)


# A decode-step fast path for a drafter's model: (input_ids, positions, slot_mapping,
# block_table) of a step of one token a row → its final hidden states, or None when the
# fast path does not serve that step (the worker's DecodeStep, worker/decode_step/).
DecodeFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], "torch.Tensor | None"]


@dataclass
class DrafterContext:
    """What a model-based proposer needs from the worker to run its own layers.

    Attributes:
        target: the target model (its embeddings and LM head are shared by heads).
        backend: the attention backend.
        block_size: tokens per KV block.
        num_blocks: KV blocks in the pool (the drafter's cache has as many, same ids).
        device / dtype: where and in what the target runs.
        kv_cache_dtype: the target's KV cache format ("auto" or "int8").
        model_config: the drafter's resolved ModelConfig (a draft model), or None.
        decode_step_for: builds the platform's decode-step fast path for a drafter's model
            over its KV caches (None where there is none; the builder may answer None).
    """

    target: torch.nn.Module
    backend: AttentionBackend
    block_size: int
    num_blocks: int
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"
    model_config: Any = None
    decode_step_for: Callable[[torch.nn.Module, list[torch.Tensor]], DecodeFn | None] | None = None


def make_proposer(config: SpeculativeConfig, context: DrafterContext | None = None) -> Proposer:
    """The proposer of `config.method` (model-based ones need the worker's `context`)."""
    if config.method == "ngram":
        return NgramLookup(config)
    assert context is not None, f"method {config.method!r} needs the worker's context"
    if config.method == "medusa":
        from pagedllm.spec_decode.medusa import MedusaProposer

        return MedusaProposer(config, context)
    if config.method == "draft_model":
        from pagedllm.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(config, context)
    if config.method in ("eagle", "eagle3"):
        from pagedllm.spec_decode.eagle import EagleProposer

        return EagleProposer(config, context)
    raise ValueError(f"speculative_config method {config.method!r} is not built yet.")
