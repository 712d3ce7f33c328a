"""Decode steps replayed from captured CUDA graphs, over persistent input buffers.

A decode step of a small model on a GPU is bound by launching its kernels (hundreds per
step), not by running them. vLLM's answer, and ours: capture the model's forward once per
batch size of a fixed list (the capture sizes), then run each decode step by copying its
inputs into the same device buffers the graph was captured on and replaying the graph.
A step of n requests runs the smallest captured size >= n; the extra rows are padding: each
is token 0 at position 0 with a context of one token, slot 0 of the null block (block
tables are zero there), so it writes and reads only that slot. All padding rows compute the
same values, every value stays finite, and no request reads the null block unmasked.

Only what changes is copied per step: the token ids, positions, slots and sequence lengths
of the n live rows (one host-to-device copy from pinned memory) and their block table rows
(a second); the rows past
n are reset to padding only when the previous step had live rows there. The query start
offsets are 0, 1, 2, ... for every batch: they never change. Everything the graph
reads lives in these buffers, so the attention backend must take all its step metadata
from tensors (`AttentionBackend.cuda_graph_safe`).

Served: decode-only steps (every request one query token) of at most the largest capture
size, with one KV cache group, no speculative decoding, no LoRA and one pipeline stage.
Anything else runs eagerly. `enforce_eager=True` turns graphs off.

`capture` is torch.cuda.graph on CUDA. Elsewhere the runner can still be built with
`replay_by_rerunning=True`, which "replays" by running the forward again on the same
buffers (no graph, for tests on CPU: it checks the buffers, the padding and the metadata
without a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata
from pagedllm.layers.forward_context import ForwardContext, set_forward_context
from pagedllm.platform import get_platform
from pagedllm.worker.decode_step.base import DecodeBatch, DecodeStep

# Batch sizes captured by default: vLLM's list ([1, 2, 4], then steps of 8 up to 256 and
# of 16 beyond), cut at the engine's max_num_seqs.
_DEFAULT_MAX_CAPTURE_SIZE = 512


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's CUDA graph capture sizes up to `max_num_seqs` (and 512), always including
    the largest batch the scheduler can form when that is smaller than the list's end."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, _DEFAULT_MAX_CAPTURE_SIZE + 1, 16)]
    limit = min(max_num_seqs, _DEFAULT_MAX_CAPTURE_SIZE)
    kept = [size for size in sizes if size <= limit]
    if not kept or kept[-1] < limit:
        kept.append(limit)
    return kept


@dataclass
class _DecodeBuffers:
    """Device tensors every captured graph reads, sized for the largest capture size."""

    input_ids: torch.Tensor  # [max_batch] int64
    positions: torch.Tensor  # [max_batch] int64
    slot_mapping: torch.Tensor  # [max_batch] int64
    seq_lens: torch.Tensor  # [max_batch] int64
    query_start_loc: torch.Tensor  # [max_batch + 1] int64: 0, 1, 2, ... (constant)
    block_tables: torch.Tensor  # [max_batch, max_blocks] int64


@dataclass
class _Graph:
    """One captured batch size: its replay and the hidden states it writes."""

    replay: Callable[[], None]
    output: torch.Tensor  # [batch, hidden_size]


class DecodeGraphs(DecodeStep):
    """Captured decode forwards per batch size, and the buffers they read.

    Args:
        model: the model; called as model(input_ids, positions) → hidden states.
        backend: a CUDA-graph-safe attention backend.
        kv_caches: the per-layer KV caches the graphs write and read.
        block_size: tokens per KV block.
        max_blocks_per_seq: block table width (max_model_len / block_size, rounded up).
        capture_sizes: the batch sizes to capture, ascending.
        device: where the model runs.
        replay_by_rerunning: "replay" by running the forward again on the same buffers
            instead of a captured graph (tests on CPU).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        block_size: int,
        max_blocks_per_seq: int,
        capture_sizes: list[int],
        device: torch.device,
        replay_by_rerunning: bool = False,
    ) -> None:
        if not backend.cuda_graph_safe:
            raise ValueError(f"The {backend.name!r} attention backend cannot be captured.")
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.capture_sizes = sorted(capture_sizes)
        self.device = device
        self.replay_by_rerunning = replay_by_rerunning
        max_batch = self.capture_sizes[-1]

        # Token ids, positions, slots and sequence lengths in one tensor: one copy a step.
        self._rows = torch.zeros(4, max_batch, dtype=torch.int64, device=device)
        self.buffers = _DecodeBuffers(
            input_ids=self._rows[0],
            positions=self._rows[1],
            slot_mapping=self._rows[2],
            seq_lens=self._rows[3],
            query_start_loc=torch.arange(max_batch + 1, dtype=torch.int64, device=device),
            block_tables=torch.zeros(
                max_batch, max_blocks_per_seq, dtype=torch.int64, device=device
            ),
        )
        # Host staging (pinned on CUDA, so the copies are asynchronous). Rewriting it at the
        # next step is safe: a step ends by reading its sampled tokens, after the replay.
        pinned = get_platform(device).pin_memory
        self._rows_staging = torch.zeros(4, max_batch, dtype=torch.int64, pin_memory=pinned)
        self._table_staging = torch.zeros(
            max_batch, max_blocks_per_seq, dtype=torch.int64, pin_memory=pinned
        )
        self._live_rows = 0  # rows of the buffers holding the previous step's requests
        self._graphs: dict[int, _Graph] = {}
        self._pool: Any = None  # the graphs' shared memory pool (CUDA)

    @property
    def max_batch_size(self) -> int:
        """The largest batch a graph serves."""
        return self.capture_sizes[-1]

    def capture_all(self) -> None:
        """Capture every batch size, largest first (later ones reuse its memory pool)."""
        for size in reversed(self.capture_sizes):
            self._graphs[size] = self._capture(size)

    def padded_size(self, num_reqs: int) -> int:
        """The captured batch size a step of `num_reqs` decodes runs at."""
        for size in self.capture_sizes:
            if size >= num_reqs:
                return size
        raise ValueError(f"{num_reqs} requests exceed the largest capture size.")

    def serves(self, batch: DecodeBatch) -> bool:
        """Whether a decode step of this size and block table width can replay a graph
        (of one KV cache group: the graphs read one table)."""
        return (
            0 < batch.num_rows <= self.max_batch_size and not batch.more_groups
            and batch.block_table.shape[1] <= self.buffers.block_tables.shape[1]
        )

    def run(self, batch: DecodeBatch) -> torch.Tensor:
        """Hidden states [n, hidden_size] of a decode step of n requests (one token each),
        from the graph of the smallest capture size >= n. The result is a view of the
        graph's output: valid until the next replay."""
        num_reqs = batch.num_rows
        self._fill(batch.input_ids, batch.positions, batch.slot_mapping, batch.block_table)
        graph = self._graphs.get(self.padded_size(num_reqs))
        if graph is None:
            raise RuntimeError("capture_all() must run before the first decode step.")
        graph.replay()
        return graph.output[:num_reqs]

    def _fill(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        block_table: np.ndarray,
    ) -> None:
        """Copy the live rows in; reset the rows the previous step used beyond them."""
        n, width = len(input_ids), block_table.shape[1]
        rows = self._rows_staging.numpy()
        rows[0, :n], rows[1, :n], rows[2, :n] = input_ids, positions, slot_mapping
        rows[3, :n] = positions + 1
        self._rows[:, :n].copy_(self._rows_staging[:, :n], non_blocking=True)
        tables = self._table_staging.numpy()
        tables[:n, :width] = block_table
        tables[:n, width:] = 0
        self.buffers.block_tables[:n].copy_(self._table_staging[:n], non_blocking=True)
        if self._live_rows > n:
            self._reset_padding(n, self._live_rows)
        self._live_rows = n

    def _reset_padding(self, start: int, end: int) -> None:
        """Rows [start, end) back to padding: token 0 at position 0 in the null slot."""
        buffers = self.buffers
        for buffer in (buffers.input_ids, buffers.positions, buffers.slot_mapping,
                       buffers.block_tables):
            buffer[start:end] = 0
        buffers.seq_lens[start:end] = 1

    def _metadata(self, size: int) -> object:
        """The backend's metadata for a batch of `size`, over views of the buffers."""
        buffers = self.buffers
        ones = [1] * size
        common = CommonAttentionMetadata(  # the host lists are not read by a safe backend
            num_reqs=size,
            num_tokens=size,
            query_start_loc=buffers.query_start_loc[: size + 1],
            query_lens=torch.ones(size, dtype=torch.int64, device=self.device),
            context_lens=buffers.positions[:size],
            seq_lens=buffers.seq_lens[:size],
            max_query_len=1,
            max_seq_len=buffers.block_tables.shape[1] * self.block_size,
            block_tables=buffers.block_tables[:size],
            slot_mapping=buffers.slot_mapping[:size],
            query_lens_cpu=ones,
            seq_lens_cpu=ones,
            for_cuda_graph=True,
        )
        return self.backend.build_metadata(common, self.block_size)

    def _forward(self, size: int, metadata: object) -> torch.Tensor:
        context = ForwardContext(self.backend, metadata, self.kv_caches, None)
        with set_forward_context(context):
            return self.model(self.buffers.input_ids[:size], self.buffers.positions[:size])

    def _capture(self, size: int) -> _Graph:
        """Warm the forward up at `size` (Triton compiles, allocators settle), capture it."""
        self._fill_padding_only()
        metadata = self._metadata(size)
        output = self._forward(size, metadata)  # warm-up, eager
        if self.replay_by_rerunning:
            def rerun() -> None:
                output.copy_(self._forward(size, metadata))

            return _Graph(rerun, output)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            captured = self._forward(size, metadata)
        if self._pool is None:
            self._pool = graph.pool()
        return _Graph(graph.replay, captured)

    def _fill_padding_only(self) -> None:
        """Every row padding (what a capture runs on: no request's cache is touched)."""
        self._reset_padding(0, self.max_batch_size)
        self._live_rows = 0
