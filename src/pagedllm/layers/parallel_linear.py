"""Tensor-parallel linear layers and embedding (Megatron's split, vLLM's names).

- `ColumnParallelLinear` / `MergedColumnParallelLinear`: each rank holds its share of the
  output rows (of every sub-output for a fused gate_up) and computes its share of the
  output; no communication.
- `RowParallelLinear`: each rank holds the input columns matching the previous layer's
  output share; the partial products are summed over the group by one all-reduce. A bias
  is kept on the group's first rank only (zeros elsewhere), so the sum adds it once.
- `QKVParallelLinear`: the fused q/k/v split by heads (KV heads replicated when fewer than
  the ranks); `VocabParallelEmbedding`: the table split by vocabulary rows;
  `ParallelLMHead`: the vocabulary projection split the same way, logits all-gathered.

The loaders take the checkpoint's full tensors (or GroupCodes) and keep the rank's slice.
With a group of one they are the plain layers (the models always build these). The worker
and executor that run one process per rank come next (README "Not built yet").
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.distributed.parallel_state import GroupCoordinator, get_tp_group
from pagedllm.distributed.sharding import divide, head_shard, vocab_shard
from pagedllm.layers.embedding import GreedyTail, LMHead, VocabEmbedding
from pagedllm.layers.linear import Linear, MergedColumnLinear, QKVLinear, default_weight_loader
from pagedllm.layers.nonfinite import mark_nonfinite_rows
from pagedllm.layers.quantization import INT4_GROUP_SIZE, GroupCodes

Weight = torch.Tensor | GroupCodes


def slice_rows(loaded: Weight, start: int, size: int) -> Weight:
    """Rows [start, start + size) of a tensor or of GroupCodes."""
    if isinstance(loaded, GroupCodes):
        return loaded.map_rows(lambda t: t.narrow(0, start, size))
    return loaded.narrow(0, start, size)


def slice_columns(loaded: Weight, start: int, size: int) -> Weight:
    """Columns [start, start + size) of a matrix; GroupCodes stay codes when the slice is
    whole groups of 32 inputs in the layer's own order, else they are dequantized."""
    if not isinstance(loaded, GroupCodes):
        return loaded.narrow(1, start, size)
    whole = start % INT4_GROUP_SIZE == 0 and size % INT4_GROUP_SIZE == 0
    if not whole or loaded.input_perm is not None or loaded.has_half_scales:
        return loaded.dense(torch.float32).narrow(1, start, size)
    first, count = start // INT4_GROUP_SIZE, size // INT4_GROUP_SIZE
    mins = None if loaded.mins is None else loaded.mins.narrow(1, first, count)
    return GroupCodes(loaded.codes.narrow(1, first, count),
                      loaded.scales.narrow(1, first, count), mins)


class MergedColumnParallelLinear(MergedColumnLinear):
    """Fused sub-outputs (gate, up), each split over the group's ranks."""

    def __init__(
        self, input_size: int, output_sizes: list[int], bias: bool = False,
        tp_group: GroupCoordinator | None = None,
    ) -> None:
        group = tp_group or get_tp_group()
        self.tp_size, self.tp_rank = group.world_size, group.rank_in_group
        shares = [divide(size, self.tp_size, "a fused output") for size in output_sizes]
        super().__init__(input_size, shares, bias)
        self.full_output_sizes = list(output_sizes)

    def weight_loader(  # type: ignore[override]
        self, param: nn.Parameter, loaded_weight: Weight, shard_id: int | None = None
    ) -> None:
        """Keep this rank's rows of sub-output `shard_id` (None: a fused checkpoint tensor
        holding every sub-output)."""
        if self.tp_size == 1:
            MergedColumnLinear.weight_loader(self, param, loaded_weight, shard_id)
            return
        if shard_id is None:
            offset = 0
            for index, full in enumerate(self.full_output_sizes):
                self.weight_loader(param, slice_rows(loaded_weight, offset, full), index)
                offset += full
            return
        share = self.output_sizes[shard_id]
        super().weight_loader(param, slice_rows(loaded_weight, self.tp_rank * share, share),
                              shard_id)


class ColumnParallelLinear(MergedColumnParallelLinear):
    """One output split over the group's ranks."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False,
        tp_group: GroupCoordinator | None = None,
    ) -> None:
        super().__init__(input_size, [output_size], bias, tp_group)

    def weight_loader(  # type: ignore[override]
        self, param: nn.Parameter, loaded_weight: Weight, shard_id: int | None = None
    ) -> None:
        """Keep this rank's rows."""
        super().weight_loader(param, loaded_weight, 0 if shard_id is None else shard_id)


class RowParallelLinear(Linear):
    """The input split over the group's ranks; the output summed over them."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False,
        tp_group: GroupCoordinator | None = None, reduce_results: bool = True,
    ) -> None:
        group = tp_group or get_tp_group()
        self.tp_group = group
        self.tp_size, self.tp_rank = group.world_size, group.rank_in_group
        # False: return this rank's partial sum (the caller reduces several layers' at once).
        self.reduce_results = reduce_results
        super().__init__(divide(input_size, self.tp_size, "input size"), output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: Weight) -> None:
        """The weight's columns of this rank; the bias on the first rank only."""
        if self.tp_size == 1:
            super().weight_loader(param, loaded_weight)
            return
        if param is self.weight:
            share = self.input_size
            loaded_weight = slice_columns(loaded_weight, self.tp_rank * share, share)
        elif self.tp_rank != 0 and isinstance(loaded_weight, torch.Tensor):
            loaded_weight = torch.zeros_like(loaded_weight)  # the sum adds the bias once
        super().weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, input share] → the group's summed [T, output_size]."""
        partial = super().forward(x)
        return self.tp_group.all_reduce(partial) if self.reduce_results else partial


class QKVParallelLinear(QKVLinear):
    """q, k and v fused, split by attention heads: this rank's query heads and the KV
    heads they read (split when there are at least as many as ranks, else replicated)."""

    def __init__(
        self, hidden_size: int, head_size: int, num_heads: int, num_kv_heads: int,
        bias: bool = False, tp_group: GroupCoordinator | None = None,
    ) -> None:
        group = tp_group or get_tp_group()
        self.tp_group_size = group.world_size
        self.shard = head_shard(num_heads, num_kv_heads, group.world_size, group.rank_in_group)
        self.head_size = head_size
        self.full_q_size = num_heads * head_size
        self.full_kv_size = num_kv_heads * head_size
        super().__init__(hidden_size, head_size, len(self.shard.q_heads),
                         len(self.shard.kv_heads), bias)

    def weight_loader(  # type: ignore[override]
        self, param: nn.Parameter, loaded_weight: Weight, shard_id: str | None = None
    ) -> None:
        """Keep this rank's heads of the "q", "k" or "v" tensor (None: a fused one)."""
        if self.tp_group_size == 1:
            QKVLinear.weight_loader(self, param, loaded_weight, shard_id)
            return
        if shard_id is None:
            starts = {"q": 0, "k": self.full_q_size, "v": self.full_q_size + self.full_kv_size}
            sizes = {"q": self.full_q_size, "k": self.full_kv_size, "v": self.full_kv_size}
            for name in ("q", "k", "v"):
                self.weight_loader(param, slice_rows(loaded_weight, starts[name], sizes[name]),
                                   name)
            return
        heads = self.shard.q_heads if shard_id == "q" else self.shard.kv_heads
        rows = slice_rows(loaded_weight, heads.start * self.head_size,
                          len(heads) * self.head_size)
        super().weight_loader(param, rows, shard_id)


class VocabParallelEmbedding(VocabEmbedding):
    """The embedding table split by vocabulary rows; each rank looks up the ids it holds
    (zeros for the others) and one all-reduce assembles the vectors."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, tp_group: GroupCoordinator | None = None
    ) -> None:
        group = tp_group or get_tp_group()
        self.tp_group = group
        self.rows = vocab_shard(num_embeddings, group.world_size, group.rank_in_group)
        super().__init__(len(self.rows), embedding_dim)
        self.full_num_embeddings = num_embeddings
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded_weight: Weight) -> None:
        """Keep this rank's vocabulary rows."""
        default_weight_loader(param, _vocab_rows(loaded_weight, self.rows, self.tp_group))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] int64 → [T, embedding_dim], summed over the group."""
        if self.tp_group.world_size == 1:
            return super().forward(input_ids)
        mine = (input_ids >= self.rows.start) & (input_ids < self.rows.stop)
        local = torch.where(mine, input_ids - self.rows.start, torch.zeros_like(input_ids))
        vectors = super().forward(local) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp_group.all_reduce(vectors)


class ParallelLMHead(LMHead):
    """The LM head split by vocabulary rows (untied or tied to a VocabParallelEmbedding):
    each rank computes its share of the logits (refining its own top candidates, see
    LMHead.forward; the global top ones are among the shares'), and one all-gather joins
    them in vocabulary order."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int,
        tie_to: VocabParallelEmbedding | None = None,
        tp_group: GroupCoordinator | None = None,
    ) -> None:
        group = tp_group or get_tp_group()
        self.tp_group = group
        self.rows = vocab_shard(num_embeddings, group.world_size, group.rank_in_group)
        # Shares padded to one size so the all-gather is regular; the padding is cut after.
        self.share = -(-num_embeddings // group.world_size)
        super().__init__(len(self.rows), embedding_dim, tie_to)
        self.full_num_embeddings = num_embeddings
        if tie_to is None:
            self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded_weight: Weight) -> None:
        """Keep this rank's vocabulary rows."""
        default_weight_loader(param, _vocab_rows(loaded_weight, self.rows, self.tp_group))

    def forward(self, hidden_states: torch.Tensor, ranking_only: bool = False) -> torch.Tensor:
        """[N, embedding_dim] → [N, vocabulary] float32 logits, gathered over the group."""
        logits = super().forward(hidden_states, ranking_only)
        if self.tp_group.world_size == 1:
            return logits
        missing = self.share - logits.shape[1]
        if missing:
            logits = torch.nn.functional.pad(logits, (0, missing), value=float("-inf"))
        return self.tp_group.all_gather(logits, dim=-1)[:, : self.full_num_embeddings]

    def greedy_tail(self, hidden_states: torch.Tensor) -> GreedyTail | None:
        """The C greedy tail on one rank; None over several (their best are gathered)."""
        if self.tp_group.world_size > 1:
            return None
        return super().greedy_tail(hidden_states)

    def greedy_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Each row's argmax over the whole vocabulary: every rank's best (value, token) of
        its share, gathered ([N, 2] a rank, not the [N, vocab / ranks] logits), and the
        best of those (ties to the lower rank, so to the lower token id, as argmax)."""
        if self.tp_group.world_size == 1:
            return super().greedy_tokens(hidden_states)
        best, index = LMHead.forward(self, hidden_states, ranking_only=True).float().max(-1)
        mine = torch.stack([best.double(), (index + self.rows.start).double()], dim=-1)
        ranks = self.tp_group.all_gather(mine, dim=-1).view(len(best), -1, 2)  # [N, ranks, 2]
        winner = ranks[..., 0].argmax(dim=-1, keepdim=True)  # the first maximum
        tokens = ranks[..., 1].gather(1, winner).squeeze(1).long()
        return mark_nonfinite_rows(tokens, hidden_states)


def _vocab_rows(loaded: Weight, rows: range, group: GroupCoordinator) -> Weight:
    """A vocabulary matrix's rows for this rank (the whole of it, codes and all, alone)."""
    return loaded if group.world_size == 1 else slice_rows(loaded, rows.start, len(rows))
