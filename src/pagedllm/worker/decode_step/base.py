"""DecodeStep: a faster way than the model's layer loop to run a decode step.

A decode step of a small model is bound by dispatch, not by its work: hundreds of small
ops, each a few microseconds of Python and launching. The worker owns one fast path per
platform (the platform names which): on CPU the whole decoder stack in one C call
(cpu_stack.py), on CUDA forwards captured as graphs and replayed (cuda_graphs.py). The
model runner asks it before each decode-only step, and each mixed step where the path takes
them (`takes_mixed_steps`: the CPU stack), whether it `serves` the step, and runs it instead
of the model (`run`); anything it does not serve runs the model's layers, which are the reference:
the fast paths give the same hidden states (bit for bit on CPU).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from pagedllm.layers.embedding import GreedyTail


@dataclass
class StepRequests:
    """A mixed step's attention rows, in batch order: some compute one token (decodes),
    others several (prefill chunks); a speculative verification is split into one decode
    row per position (spec_decode/verify.py). [n] each; a row's tokens are contiguous in
    the batch. A step of prefill chunks alone is a mixed step too."""

    query_start_loc: np.ndarray
    query_lens: np.ndarray
    context_lens: np.ndarray  # tokens cached before this step


@dataclass
class DecodeBatch:
    """A step as the fast paths take it, as host arrays: decode-only, one query token per
    row (a request's decode, or one verified position of speculative decoding); or, for a
    path that takes them (`DecodeStep.takes_mixed_steps`), a mixed step (`requests`).

    Attributes:
        input_ids / positions / slot_mapping: [T] int64 (slots: of KV cache group 0).
        block_table: [rows, max_blocks] each row's blocks in KV cache group 0 (a row: a
            token of a decode-only step, a request of a mixed one).
        more_groups: (slot_mapping, block_table) of each further group (a hybrid model's
            sliding-window layers keep their own table), in group order.
        requests: a mixed step's requests; None for a decode-only step.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    block_table: np.ndarray
    more_groups: tuple[tuple[np.ndarray, np.ndarray], ...] = ()
    requests: StepRequests | None = None

    @property
    def groups(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(slot_mapping, block_table) of every KV cache group, group 0 first."""
        return [(self.slot_mapping, self.block_table), *self.more_groups]

    @property
    def num_rows(self) -> int:
        """Rows (tokens) in the step."""
        return len(self.input_ids)


class DecodeStep(ABC):
    """A decode-step fast path: it returns the final hidden states the model would."""

    # Whether it also runs steps that mix decodes with prefill chunks.
    takes_mixed_steps = False

    @abstractmethod
    def serves(self, batch: DecodeBatch) -> bool:
        """Whether this step is for the fast path (its size, the step's adapters...)."""

    @abstractmethod
    def run(self, batch: DecodeBatch) -> torch.Tensor:
        """The final hidden states [n, hidden] of the step's rows; call after `serves`."""

    def greedy_steps(
        self, batch: DecodeBatch, steps: int, head: GreedyHead,
        stop_ids: np.ndarray | None = None,
    ) -> list[list[int]] | None:
        """Up to `steps` decode steps of the decode-only `batch` in a row, each feeding its
        rows' argmax (`head`'s) to the next one position further, where the path can take
        them at once (a multi-step's extra steps: worker/multi_step.py); call after
        `serves`. `stop_ids` [rows, width] int64 (-1: none): each row's tokens that end
        its request; the steps end with the first that samples one. Returns each step's
        tokens (a last step with a non-finite row holds -1 there), or None (the default)
        where it cannot."""
        return None


class GreedyHead(Protocol):
    """The LM head as `DecodeStep.greedy_steps` uses it (layers/embedding.py LMHead)."""

    def greedy_tail(self, hidden_states: torch.Tensor) -> GreedyTail | None:
        """The C greedy tail's inputs for rows like `hidden_states`, or None."""
