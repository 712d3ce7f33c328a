"""Tensor-parallel layers over two gloo ranks: a gated MLP built from a merged
column-parallel gate_up and a row-parallel down (with biases), loaded from the full
checkpoint tensors, equals the unsplit MLP; q/k/v split by heads with the KV head
replicated; the vocabulary-parallel embedding equals the full table's lookup. The loaders'
row and column slices of file codes equal the slices of their dense weights."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.multiprocessing as mp

from pagedllm.distributed import parallel_state
from pagedllm.layers.activation import gated_activation
from pagedllm.layers.parallel_linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    slice_columns,
    slice_rows,
)
from pagedllm.layers.quantization import GroupCodes

HIDDEN, INTERMEDIATE, TOKENS = 64, 128, 3


def _weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"gate": torch.randn(INTERMEDIATE, HIDDEN), "up": torch.randn(INTERMEDIATE, HIDDEN),
            "gate_bias": torch.randn(INTERMEDIATE), "up_bias": torch.randn(INTERMEDIATE),
            "down": torch.randn(HIDDEN, INTERMEDIATE), "down_bias": torch.randn(HIDDEN),
            "x": torch.randn(TOKENS, HIDDEN)}


def _reference(w: dict[str, torch.Tensor]) -> torch.Tensor:
    gate = w["x"] @ w["gate"].T + w["gate_bias"]
    up = w["x"] @ w["up"].T + w["up_bias"]
    return (torch.nn.functional.silu(gate) * up) @ w["down"].T + w["down_bias"]


def _rank_main(rank: int, world_size: int, init_file: str) -> None:
    parallel_state.init_distributed_environment(world_size, rank, f"file://{init_file}",
                                                "gloo")
    parallel_state.initialize_model_parallel(world_size)
    try:
        w = _weights()
        gate_up = MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE] * 2, bias=True)
        down = RowParallelLinear(INTERMEDIATE, HIDDEN, bias=True)
        for shard, name in enumerate(("gate", "up")):
            gate_up.weight_loader(gate_up.weight, w[name], shard)
            gate_up.weight_loader(gate_up.bias, w[f"{name}_bias"], shard)
        down.weight_loader(down.weight, w["down"])
        down.weight_loader(down.bias, w["down_bias"])
        assert gate_up.weight.shape == (INTERMEDIATE, HIDDEN)  # half of gate and of up
        assert down.weight.shape == (HIDDEN, INTERMEDIATE // 2)
        out = down(gated_activation("silu")(gate_up(w["x"])))
        want = _reference(w)
        # Equal up to float32 summation order (each rank sums half of the inputs).
        torch.testing.assert_close(out, want, rtol=0, atol=1e-5 * want.abs().max().item())
        # A fused checkpoint tensor (gate | up) splits the same way.
        fused = MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE] * 2)
        fused.weight_loader(fused.weight, torch.cat([w["gate"], w["up"]]))
        assert torch.equal(fused.weight, gate_up.weight)
        single = ColumnParallelLinear(HIDDEN, INTERMEDIATE)
        single.weight_loader(single.weight, w["gate"])
        half = INTERMEDIATE // world_size
        assert torch.equal(single.weight, w["gate"][rank * half:(rank + 1) * half])
        _check_qkv(rank, world_size)
        _check_embedding(world_size)
    finally:
        parallel_state.destroy_model_parallel()


def _check_qkv(rank: int, world_size: int) -> None:
    """4 query heads, 1 KV head, 2 ranks: each has 2 query heads and the replicated KV head,
    from q/k/v tensors or from a fused one."""
    head, heads = 8, 4
    q, k, v = torch.randn(heads * head, HIDDEN), torch.randn(head, HIDDEN), torch.randn(
        head, HIDDEN)
    layer = QKVParallelLinear(HIDDEN, head, heads, 1)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        layer.weight_loader(layer.weight, tensor, name)
    per_rank = heads // world_size * head
    want = torch.cat([q[rank * per_rank:(rank + 1) * per_rank], k, v])
    assert torch.equal(layer.weight, want)
    fused = QKVParallelLinear(HIDDEN, head, heads, 1)
    fused.weight_loader(fused.weight, torch.cat([q, k, v]))
    assert torch.equal(fused.weight, want)


def _check_embedding(world_size: int) -> None:
    """The vocabulary split over the ranks (10 rows, 5 each); vectors summed back."""
    table = torch.randn(10, HIDDEN, generator=torch.Generator().manual_seed(5))
    embedding = VocabParallelEmbedding(10, HIDDEN)
    embedding.weight_loader(embedding.weight, table)
    assert embedding.weight.shape == (10 // world_size, HIDDEN)
    ids = torch.tensor([0, 9, 4, 5, 7])
    assert torch.equal(embedding(ids), table[ids])
    # The LM head over 9 rows (shares of 5 and 4: padded for the gather, cut after),
    # untied and tied to the embedding.
    hidden = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(6))
    head = ParallelLMHead(9, HIDDEN)
    head.weight_loader(head.weight, table[:9])
    torch.testing.assert_close(head(hidden), hidden @ table[:9].T)
    assert torch.equal(head.greedy_tokens(hidden), (hidden @ table[:9].T).argmax(-1))
    faulty = hidden.clone()
    faulty[1, 2] = float("nan")  # a row that is not finite: -1, on every rank alike
    assert head.greedy_tokens(faulty).tolist()[1] == -1
    tied = ParallelLMHead(10, HIDDEN, tie_to=embedding)
    torch.testing.assert_close(tied(hidden), hidden @ table.T)


def test_two_ranks_mlp_qkv_and_embedding_equal_one(tmp_path: Path):
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init")), nprocs=2, join=True)


def test_code_slices_equal_dense_slices():
    generator = torch.Generator().manual_seed(0)
    codes = GroupCodes(torch.randint(0, 16, (8, 4, 32), generator=generator, dtype=torch.uint8),
                       torch.rand(8, 4, generator=generator),
                       torch.rand(8, 4, generator=generator))
    dense = codes.dense(torch.float32)
    rows = slice_rows(codes, 2, 4)
    assert isinstance(rows, GroupCodes) and torch.equal(rows.dense(torch.float32), dense[2:6])
    columns = slice_columns(codes, 64, 64)  # whole groups: still codes
    assert isinstance(columns, GroupCodes)
    assert torch.equal(columns.dense(torch.float32), dense[:, 64:128])
    ragged = slice_columns(codes, 16, 48)  # not whole groups: dequantized
    assert isinstance(ragged, torch.Tensor) and torch.equal(ragged, dense[:, 16:64])
