"""Laying out a verification step: attention rows and sampling rows of draft tokens.

A request verifying m drafts computes 1 + m query tokens in one step. For attention they are
laid out as 1 + m decode rows that share the request's block table, row j seeing the
context plus the first j + 1 new tokens: every backend then runs them through its decode
path (on CPU the single-call decode stack), which costs about one decode step where a
(1 + m)-token prefill through the layers costs two, and scores each position exactly as a
plain decode of that position would. For sampling, row j is prepared as the decode of
output position n + j, with the drafts before it as history (penalties, min_tokens, seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedllm.layers.sampler import SamplingMetadata
from pagedllm.sampling_params import SamplingParams


@dataclass
class AttentionRows:
    """A step's batch as attention sees it, verification requests split into decode rows.

    Attributes:
        query_start_loc: [rows + 1]; query_lens / context_lens: [rows].
        block_tables: per KV cache group, [rows, max_blocks].
    """

    query_start_loc: np.ndarray
    query_lens: np.ndarray
    context_lens: np.ndarray
    block_tables: list[np.ndarray]


def split_verify_rows(
    query_lens: np.ndarray,
    context_lens: np.ndarray,
    block_tables: list[np.ndarray],
    num_drafts: np.ndarray,
) -> AttentionRows:
    """Split every request with drafts (`num_drafts` > 0, per batch row) into one decode
    row per query token; other requests keep their row."""
    is_verify = num_drafts > 0  # [n]
    repeats = np.where(is_verify, query_lens, 1)  # [n]
    row_of = np.repeat(np.arange(len(query_lens)), repeats)  # [rows]
    first = np.repeat(np.cumsum(repeats) - repeats, repeats)  # [rows]
    offset = np.arange(len(row_of)) - first  # token offset within a split request
    split = is_verify[row_of]
    new_query_lens = np.where(split, 1, query_lens[row_of])
    new_context_lens = context_lens[row_of] + np.where(split, offset, 0)
    query_start_loc = np.zeros(len(row_of) + 1, dtype=np.int64)
    np.cumsum(new_query_lens, out=query_start_loc[1:])
    return AttentionRows(
        query_start_loc=query_start_loc,
        query_lens=new_query_lens,
        context_lens=new_context_lens,
        block_tables=[table[row_of] for table in block_tables],
    )


def build_verify_metadata(
    params: Sequence[SamplingParams],
    num_output_tokens: Sequence[int],
    eos_token_ids: Sequence[int | None],
    token_ids: Sequence[Sequence[int]],
    num_prompt_tokens: Sequence[int],
    drafts: Sequence[Sequence[int]],
    device: torch.device,
) -> SamplingMetadata:
    """Sampling metadata of 1 + len(drafts[i]) rows per request: row j as the decode of
    output position num_output_tokens[i] + j after drafts[i][:j]."""
    counts = [len(d) + 1 for d in drafts]
    rows = [(i, j) for i, count in enumerate(counts) for j in range(count)]
    needs_history = any(p.has_penalties or p.bad_words_token_ids for p in params)
    history = None
    if needs_history:  # a row without drafts before it reads its tokens as they are
        history = [token_ids[i] if j == 0 else [*token_ids[i], *drafts[i][:j]] for i, j in rows]
    return SamplingMetadata.build(
        [params[i] for i, _ in rows],
        [num_output_tokens[i] + j for i, j in rows],
        [eos_token_ids[i] for i, _ in rows],
        device,
        token_ids=history,
        num_prompt_tokens=[num_prompt_tokens[i] for i, _ in rows] if needs_history else None,
    )
