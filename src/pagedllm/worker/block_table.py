"""Block tables as arrays: padded block-id rows and slot mappings for new tokens.

A slot is `block_id * block_size + offset`. Padding entries point at block 0, the null block
the KV cache manager never hands out, so padded gathers read finite (zero) values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def make_block_table_array(block_tables: list[list[int]]) -> np.ndarray:
    """Pad per-request block id lists into a [num_reqs, max_num_blocks] int64 array."""
    max_num_blocks = max((len(t) for t in block_tables), default=0)
    table = np.zeros((len(block_tables), max(max_num_blocks, 1)), dtype=np.int64)
    for row, block_ids in enumerate(block_tables):
        table[row, : len(block_ids)] = block_ids
    return table


def group_block_tables(
    block_ids: Sequence[Sequence[list[int]]],  # [num_reqs][num_groups] each group's ids
    windows: Sequence[int | None],  # [num_groups] each group's sliding window, or None
    context_lens: np.ndarray,  # [num_reqs] tokens cached before the step
    block_size: int,
) -> list[np.ndarray]:
    """Each KV cache group's [num_reqs, max_num_blocks] table of a step. In a window's
    table the blocks wholly behind each request's window point at the null block
    (null_skipped_blocks); the step's positions, at or past the context length, all lie
    in blocks it keeps, so their slots come from the same table."""
    tables = []
    for group, window in enumerate(windows):
        table = make_block_table_array([ids[group] for ids in block_ids])
        if window is not None:
            null_skipped_blocks(table, context_lens, window, block_size)
        tables.append(table)
    return tables


def compute_slot_mapping(
    block_table: np.ndarray,  # [num_reqs, max_num_blocks]
    req_indices: np.ndarray,  # [num_tokens] row of each token
    positions: np.ndarray,  # [num_tokens] position of each token in its sequence
    block_size: int,
) -> np.ndarray:  # [num_tokens]
    """Cache slot of every new token."""
    block_ids = block_table[req_indices, positions // block_size]
    return block_ids * block_size + positions % block_size


def null_skipped_blocks(
    block_table: np.ndarray,  # [num_reqs, max_num_blocks], changed in place
    context_lens: np.ndarray,  # [num_reqs]
    sliding_window: int,
    block_size: int,
) -> None:
    """Point the blocks wholly outside each request's window at the null block.

    The scheduler lets those blocks go (another request may be writing them now) without
    telling the worker, whose tables only grow; no query of this step can see them, and
    the null block's zeros are safe to gather where a kernel reads a whole block.
    """
    num_skipped = np.maximum(context_lens - sliding_window + 1, 0) // block_size  # [num_reqs]
    columns = np.arange(block_table.shape[1])
    block_table[columns[None, :] < num_skipped[:, None]] = 0
