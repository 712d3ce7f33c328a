"""How a decoder's matrices split across tensor-parallel ranks (Megatron's layout).

- Column-parallel (q/k/v, gate/up): each rank holds a slice of the output rows and
  computes its slice of the output; no communication.
- Row-parallel (o, down): each rank holds the input columns matching its slice of the
  previous column-parallel output; the partial products are summed by one all-reduce.
- Attention heads: query heads split evenly; KV heads split too when there are at least as
  many as ranks, else each is replicated on the ranks whose query heads read it.
- Vocabulary (embedding, LM head): rows split evenly (padded to a multiple of the ranks).

These functions compute the slices; the layers and loaders apply them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def divide(numerator: int, denominator: int, what: str) -> int:
    """numerator / denominator, which must be whole.

    Raises:
        ValueError: naming `what` when it does not split evenly.
    """
    if numerator % denominator:
        raise ValueError(
            f"{what} ({numerator}) does not split over tensor_parallel_size={denominator}."
        )
    return numerator // denominator


@dataclass(frozen=True)
class HeadShard:
    """The attention heads one rank holds.

    Attributes:
        q_heads: range of query heads.
        kv_heads: range of KV heads (a single replicated one when KV heads < ranks).
    """

    q_heads: range
    kv_heads: range


def head_shard(num_heads: int, num_kv_heads: int, tp_size: int, tp_rank: int) -> HeadShard:
    """Rank `tp_rank`'s query and KV heads.

    Raises:
        ValueError: when the query heads do not split evenly, or KV heads neither split
            nor replicate evenly.
    """
    per_rank = divide(num_heads, tp_size, "num_attention_heads")
    q_heads = range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    return HeadShard(q_heads, kv_head_range(num_kv_heads, tp_size, tp_rank))


def kv_head_range(num_kv_heads: int, tp_size: int, tp_rank: int) -> range:
    """Rank `tp_rank`'s KV heads: an even split, or one replicated head when there are
    fewer KV heads than ranks (also what a KV connector sends each rank of a peer).

    Raises:
        ValueError: when the KV heads neither split nor replicate evenly.
    """
    if num_kv_heads >= tp_size:
        kv_per_rank = divide(num_kv_heads, tp_size, "num_key_value_heads")
        return range(tp_rank * kv_per_rank, (tp_rank + 1) * kv_per_rank)
    ranks_per_kv = divide(tp_size, num_kv_heads, "tensor_parallel_size / num_key_value_heads")
    kv = tp_rank // ranks_per_kv
    return range(kv, kv + 1)


def shard_rows(weight: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    """A column-parallel matrix's rows (outputs) for `tp_rank`."""
    rows = divide(weight.shape[0], tp_size, "output size")
    return weight.narrow(0, tp_rank * rows, rows)


def shard_columns(weight: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    """A row-parallel matrix's columns (inputs) for `tp_rank`."""
    cols = divide(weight.shape[1], tp_size, "input size")
    return weight.narrow(1, tp_rank * cols, cols)


def shard_heads(weight: torch.Tensor, heads: range, head_size: int) -> torch.Tensor:
    """The rows of the heads `heads` of a per-head projection [num_heads * head_size, ...]."""
    return weight.narrow(0, heads.start * head_size, len(heads) * head_size)


def vocab_shard(vocab_size: int, tp_size: int, tp_rank: int) -> range:
    """The vocabulary rows rank `tp_rank` holds (the vocabulary padded to whole shares)."""
    per_rank = -(-vocab_size // tp_size)
    start = min(tp_rank * per_rank, vocab_size)
    return range(start, min(start + per_rank, vocab_size))
