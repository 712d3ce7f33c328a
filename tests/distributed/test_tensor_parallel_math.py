"""Tensor-parallel groups over gloo in two spawned processes: the collectives, and a
Megatron-split MLP and attention (column-parallel in, row-parallel out, one all-reduce)
equal to the unsplit computation. Plus the head and vocabulary shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from pagedllm.distributed import parallel_state
from pagedllm.distributed.sharding import (
    HeadShard,
    divide,
    head_shard,
    shard_columns,
    shard_heads,
    shard_rows,
    vocab_shard,
)

HIDDEN, INTERMEDIATE, HEADS, HEAD_SIZE, TOKENS = 16, 24, 4, 4, 5


def _full_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "gate": torch.randn(INTERMEDIATE, HIDDEN), "up": torch.randn(INTERMEDIATE, HIDDEN),
        "down": torch.randn(HIDDEN, INTERMEDIATE), "x": torch.randn(TOKENS, HIDDEN),
        "q": torch.randn(HEADS * HEAD_SIZE, HIDDEN), "k": torch.randn(HEAD_SIZE, HIDDEN),
        "v": torch.randn(HEAD_SIZE, HIDDEN), "o": torch.randn(HIDDEN, HEADS * HEAD_SIZE),
    }


def _mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def _attention(x, q, k, v, o, num_heads):
    """Causal attention of `num_heads` query heads sharing one KV head."""
    queries = (x @ q.T).view(TOKENS, num_heads, HEAD_SIZE).transpose(0, 1)
    keys, values = x @ k.T, x @ v.T
    scores = queries @ keys.T / HEAD_SIZE**0.5
    scores = scores.masked_fill(torch.ones(TOKENS, TOKENS).triu(1).bool(), float("-inf"))
    out = (scores.softmax(-1) @ values).transpose(0, 1).reshape(TOKENS, -1)
    return out @ o.T


def _rank_main(rank: int, world_size: int, init_file: str) -> None:
    parallel_state.init_distributed_environment(world_size, rank, f"file://{init_file}",
                                                "gloo")
    group = parallel_state.initialize_model_parallel(world_size)
    try:
        assert parallel_state.get_tp_group() is group and group.rank_in_group == rank
        total = group.all_reduce(torch.tensor([float(rank + 1)]))
        assert total.item() == sum(range(1, world_size + 1))
        gathered = group.all_gather(torch.tensor([[float(rank)]]), dim=1)
        assert gathered.tolist() == [[float(r) for r in range(world_size)]]
        shared = group.broadcast(torch.tensor([float(rank + 10)]))
        assert shared.item() == 10.0

        w = _full_weights()
        # MLP: gate/up column-parallel, down row-parallel, one all-reduce.
        partial = _mlp(w["x"], shard_rows(w["gate"], world_size, rank),
                       shard_rows(w["up"], world_size, rank),
                       shard_columns(w["down"], world_size, rank))
        torch.testing.assert_close(group.all_reduce(partial),
                                   _mlp(w["x"], w["gate"], w["up"], w["down"]))
        # Attention with one KV head for two ranks: query heads split, the KV head replicated.
        shard = head_shard(HEADS, 1, world_size, rank)
        partial = _attention(w["x"], shard_heads(w["q"], shard.q_heads, HEAD_SIZE),
                             shard_heads(w["k"], shard.kv_heads, HEAD_SIZE),
                             shard_heads(w["v"], shard.kv_heads, HEAD_SIZE),
                             shard_columns(w["o"], world_size, rank), len(shard.q_heads))
        torch.testing.assert_close(
            group.all_reduce(partial),
            _attention(w["x"], w["q"], w["k"], w["v"], w["o"], HEADS))
    finally:
        parallel_state.destroy_model_parallel()


def test_two_ranks_split_mlp_and_attention_equal_one(tmp_path: Path):
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init")), nprocs=2, join=True)


def test_without_groups_a_rank_is_alone():
    group = parallel_state.get_tp_group()
    assert group.world_size == 1 and group.is_first_rank
    x = torch.ones(3)
    assert group.all_reduce(x) is x and group.all_gather(x) is x


def test_head_shards_split_or_replicate_kv_heads():
    assert head_shard(8, 4, 2, 1) == HeadShard(range(4, 8), range(2, 4))
    assert head_shard(8, 2, 4, 3).kv_heads == range(1, 2)  # 2 ranks share each KV head
    assert head_shard(8, 1, 4, 2).kv_heads == range(0, 1)
    with pytest.raises(ValueError, match="num_attention_heads"):
        head_shard(6, 2, 4, 0)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        head_shard(12, 6, 4, 0)


def test_vocab_shards_cover_the_vocabulary_once():
    shards = [vocab_shard(10, 3, r) for r in range(3)]
    assert [list(s) for s in shards] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match="output size"):
        divide(10, 3, "output size")
