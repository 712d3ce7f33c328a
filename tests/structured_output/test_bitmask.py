"""The bitmask layout (bit j of word i allows token 32 i + j) and its one-op application."""

from __future__ import annotations

import torch

from pagedllm.structured_output.bitmask import allowed_tokens, apply_grammar_bitmask


def _bitmask(allowed: list[set[int]], vocab_size: int) -> torch.Tensor:
    words = (vocab_size + 31) // 32
    mask = torch.zeros(len(allowed), words, dtype=torch.int32)
    for row, tokens in enumerate(allowed):
        for token in tokens:
            word, bit = divmod(token, 32)
            value = int(mask[row, word]) | (1 << bit)
            mask[row, word] = value - (1 << 32) if value >= 1 << 31 else value  # int32 bits
    return mask


def test_bits_map_to_tokens():
    allowed = [{0, 31, 32, 70}, {5}]
    got = allowed_tokens(_bitmask(allowed, 71), 71)
    assert got.shape == (2, 71)
    assert [set(torch.nonzero(row).flatten().tolist()) for row in got] == allowed


def test_only_the_constrained_rows_change():
    logits = torch.randn(4, 100)
    before = logits.clone()
    apply_grammar_bitmask(logits, _bitmask([{3, 64}, {99}], 100), rows=[2, 0])
    assert torch.equal(logits[1], before[1]) and torch.equal(logits[3], before[3])
    assert torch.isfinite(logits[2]).sum() == 2 and logits[2, 3] == before[2, 3]
    assert torch.isfinite(logits[0]).sum() == 1 and logits[0, 99] == before[0, 99]


def test_table_lookup_equals_the_bitwise_mask():
    generator = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-2**31, 2**31 - 1, (5, 4), dtype=torch.int32, generator=generator)
    logits = torch.randn(5, 100, generator=generator)
    expected = logits.masked_fill(~allowed_tokens(bitmask, 100), float("-inf"))
    apply_grammar_bitmask(logits, bitmask, rows=list(range(5)))
    assert torch.equal(logits, expected)
