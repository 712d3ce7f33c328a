"""Running a drafter's own layers over its own paged KV cache (draft models, EAGLE heads).

A drafter's cache has as many blocks as the target's and uses the target's block ids: a
request's block table addresses both, so nothing is allocated for drafts beyond the
scheduler's lookahead slots (the few positions past the request's tokens that the drafter
writes while proposing). Each forward builds attention metadata from per-row (context
length, query length, block table) exactly as the model runner does for the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedllm.attention.backend import CommonAttentionMetadata
from pagedllm.layers.forward_context import ForwardContext
from pagedllm.spec_decode.proposers import DrafterContext


def allocate_kv_caches(
    context: DrafterContext, num_layers: int, num_kv_heads: int, head_size: int
) -> list[torch.Tensor]:
    """One KV tensor per drafter layer, in the target's layout, block count and format."""
    backend = context.backend
    shape = backend.get_kv_cache_shape(
        context.num_blocks, context.block_size, num_kv_heads, head_size, context.kv_cache_dtype
    )
    dtype = backend.get_kv_cache_dtype(context.dtype, context.kv_cache_dtype)
    caches = []
    for _ in range(num_layers):
        cache = torch.empty(shape, dtype=dtype, device=context.device)
        cache.zero_()  # padded reads land anywhere in unused slots: keep them finite
        caches.append(cache)
    return caches


@dataclass
class DraftBatch:
    """One drafter forward pass: rows of consecutive tokens after a cached context.

    Attributes:
        input_ids / positions: [T] int64.
        query_lens / context_lens: [rows] int64.
        block_tables: per row, its block table.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    query_lens: np.ndarray
    context_lens: np.ndarray
    block_tables: list[list[int]]

    @classmethod
    def build(
        cls, tokens: list[list[int]], starts: list[int], block_tables: list[list[int]]
    ) -> DraftBatch:
        """Row i computes `tokens[i]` at positions starts[i], starts[i] + 1, ..."""
        query_lens = np.array([len(t) for t in tokens], dtype=np.int64)
        context_lens = np.array(starts, dtype=np.int64)
        positions = np.concatenate(
            [np.arange(s, s + n) for s, n in zip(starts, query_lens.tolist(), strict=True)]
        ).astype(np.int64)
        input_ids = np.array([t for row in tokens for t in row], dtype=np.int64)
        return cls(input_ids, positions, query_lens, context_lens, block_tables)

    @property
    def last_token_indices(self) -> np.ndarray:
        """[rows] the batch index of each row's last token."""
        return np.cumsum(self.query_lens) - 1

    def table_and_slots(self, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """([rows, max_blocks] the rows' block tables padded with 0, [T] each token's
        cache slot)."""
        num_rows = len(self.query_lens)
        width = max((len(t) for t in self.block_tables), default=1)
        table = np.zeros((num_rows, max(width, 1)), dtype=np.int64)
        for row, blocks in enumerate(self.block_tables):
            table[row, : len(blocks)] = blocks
        rows = np.repeat(np.arange(num_rows), self.query_lens)
        slots = table[rows, self.positions // block_size] * block_size
        return table, slots + self.positions % block_size


def forward_context(
    context: DrafterContext, batch: DraftBatch, kv_caches: list[torch.Tensor]
) -> ForwardContext:
    """The forward context of one drafter pass (metadata built once for all its layers)."""
    device, block_size = context.device, context.block_size
    num_rows = len(batch.query_lens)
    table, slots = batch.table_and_slots(block_size)
    query_start_loc = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(batch.query_lens, out=query_start_loc[1:])
    seq_lens = batch.context_lens + batch.query_lens

    def to_device(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device)

    common = CommonAttentionMetadata(
        num_reqs=num_rows,
        num_tokens=len(batch.input_ids),
        query_start_loc=to_device(query_start_loc),
        query_lens=to_device(batch.query_lens),
        context_lens=to_device(batch.context_lens),
        seq_lens=to_device(seq_lens),
        max_query_len=int(batch.query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_tables=to_device(table),
        slot_mapping=to_device(slots),
        query_lens_cpu=batch.query_lens.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
        # A drafter rewrites positions (its own guesses, then the accepted tokens).
        contexts_rewritten=True,
    )
    metadata = context.backend.build_metadata(common, block_size)
    return ForwardContext(context.backend, metadata, kv_caches)


def capacity(block_table: list[int], block_size: int) -> int:
    """Positions a block table can hold."""
    return len(block_table) * block_size
