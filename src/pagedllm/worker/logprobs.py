"""Which positions of a step are scored for logprobs, and turning the results into lists.

The runner computes logprobs in two places: for the token it samples (`logprobs=k`) and for
prompt tokens (`prompt_logprobs=k`). This module holds the bookkeeping around that: where in
the flattened batch each prompt chunk's positions are, which token each position is scored
on, and slicing batched results back into per-request `LogprobsLists`.

Must not: touch scheduler state or return tensors to anything outside the worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedllm.layers.logprobs import TokenLogprobs
from pagedllm.worker.input_batch import CachedRequestState, StepInputs
from pagedllm.worker.outputs import LogprobsLists


def resolve_num_top(num_logprobs: int, vocab_size: int) -> int:
    """The number of top tokens to return: -1 means the whole vocabulary."""
    return vocab_size if num_logprobs == -1 else num_logprobs


@dataclass
class PromptLogprobsPlan:
    """The prompt positions scored this step, over every row that asked for prompt logprobs.

    Position j of a request predicts token j + 1, so a chunk computing positions [c, c + q)
    of a prompt of P tokens scores prompt tokens c + 1 .. min(c + q, P - 1); position P - 1
    predicts the first output token and belongs to sampling instead.

    Attributes:
        rows: batch rows whose prompt logprobs are in progress (possibly 0 positions now).
        num_positions: per row, positions scored this step.
        num_logprobs: per row, the requested number of top tokens (-1: whole vocabulary).
        hidden_indices: [M] indices of the scored positions in the flattened batch.
        target_ids: [M] the actual next prompt token at each scored position.
        is_complete: per row, True when this step finishes the prompt.
    """

    rows: list[int]
    num_positions: list[int]
    num_logprobs: list[int]
    hidden_indices: np.ndarray
    target_ids: np.ndarray
    is_complete: list[bool]


def plan_prompt_logprobs(
    inputs: StepInputs, states: Sequence[CachedRequestState]
) -> PromptLogprobsPlan | None:
    """The prompt positions to score this step, or None when no row needs any."""
    rows = [i for i, s in enumerate(states) if s.in_progress_prompt_logprobs is not None]
    if not rows:
        return None
    num_positions: list[int] = []
    num_logprobs: list[int] = []
    is_complete: list[bool] = []
    hidden_indices: list[np.ndarray] = []
    target_ids: list[int] = []
    for row in rows:
        state = states[row]
        start = int(inputs.context_lens[row])
        query_len = int(inputs.query_lens[row])
        end = min(start + query_len, state.num_prompt_tokens - 1)
        count = max(0, end - start)
        num_positions.append(count)
        num_logprobs.append(state.sampling_params.prompt_logprobs or 0)
        is_complete.append(start + query_len >= state.num_prompt_tokens)
        hidden_indices.append(int(inputs.query_start_loc[row]) + np.arange(count))
        target_ids.extend(state.token_ids[start + 1 : start + 1 + count])
    return PromptLogprobsPlan(
        rows=rows,
        num_positions=num_positions,
        num_logprobs=num_logprobs,
        hidden_indices=np.concatenate(hidden_indices).astype(np.int64),
        target_ids=np.asarray(target_ids, dtype=np.int64),
        is_complete=is_complete,
    )


def concat_token_logprobs(results: Sequence[TokenLogprobs]) -> TokenLogprobs:
    """Rows of several batches (same k) as one batch."""
    return TokenLogprobs(
        token_ids=torch.cat([r.token_ids for r in results]),
        logprobs=torch.cat([r.logprobs for r in results]),
        ranks=torch.cat([r.ranks for r in results]),
    )


def split_logprobs(
    result: TokenLogprobs, num_positions: Sequence[int], num_top: Sequence[int]
) -> list[LogprobsLists]:
    """Cut batched results into per-request lists, each row trimmed to its own 1 + k."""
    token_ids = result.token_ids.tolist()
    logprobs = result.logprobs.tolist()
    ranks = result.ranks.tolist()
    lists = []
    start = 0
    for count, k in zip(num_positions, num_top, strict=True):
        end = start + count
        lists.append(
            LogprobsLists(
                token_ids=[row[: 1 + k] for row in token_ids[start:end]],
                logprobs=[row[: 1 + k] for row in logprobs[start:end]],
                ranks=ranks[start:end],
            )
        )
        start = end
    return lists
