"""Encoder attention over packed sequences: grouped by length inside the call, it equals
attention run on each sequence alone, whatever the mix of lengths."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from pagedllm.attention.encoder import length_groups, packed_bidirectional_attention


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_equals_each_sequence_alone(num_kv_heads: int) -> None:
    rng = random.Random(0)
    seq_lens = [rng.randint(1, 130) for _ in range(40)] + [7, 7, 7]
    total = sum(seq_lens)
    torch.manual_seed(0)
    query = torch.randn(total, 4, 8)
    key, value = torch.randn(total, num_kv_heads, 8), torch.randn(total, num_kv_heads, 8)
    out = packed_bidirectional_attention(query, key, value, seq_lens, 0.3)
    start = 0
    for length in seq_lens:
        rows = slice(start, start + length)
        want = F.scaled_dot_product_attention(
            query[rows].transpose(0, 1), key[rows].transpose(0, 1), value[rows].transpose(0, 1),
            scale=0.3, enable_gqa=num_kv_heads != 4,
        ).transpose(0, 1)  # fmt: skip
        torch.testing.assert_close(out[rows], want, atol=1e-5, rtol=1e-5)
        start += length


def test_groups_hold_similar_lengths() -> None:
    seq_lens = [100, 5, 6, 104, 40, 5, 120]
    groups = length_groups(seq_lens)
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert groups[0] == [1, 5, 2]  # 5, 5, 6: shortest first
    for group in groups:
        lens = [seq_lens[i] for i in group]
        assert max(lens) <= min(lens) * 1.3 + 4
