"""Decode contexts kept across steps (attention/decode_contexts.py, the grouped torch
backend's) give the same attention as the stateless reference gathering them afresh."""

from __future__ import annotations

import torch

from pagedllm.attention.torch_grouped import TorchGroupedBackend
from pagedllm.attention.torch_paged import TorchPagedBackend

from .test_torch_paged import dense_causal_attention, make_common_metadata

BLOCK_SIZE = 4
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 4, 2, 8


def _step(backend, cache, requests, generator):
    """One decode step (query_len 1 per request) through `backend`; returns its output."""
    common = make_common_metadata(requests, BLOCK_SIZE)
    metadata = backend.build_metadata(common, BLOCK_SIZE)
    num_tokens = len(requests)
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_SIZE, generator=generator)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    v = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    fresh_cache = cache.clone()
    out = backend.forward(q, k, v, cache, metadata, HEAD_SIZE**-0.5)
    # The stateless reference gathers every context: the expected output of the same step.
    fresh = TorchPagedBackend()
    expected = fresh.forward(
        q, k, v, fresh_cache, fresh.build_metadata(common, BLOCK_SIZE), HEAD_SIZE**-0.5
    )
    return out, expected, metadata


def test_kept_contexts_equal_fresh_gathers_over_many_steps():
    generator = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 64, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    cache[:, 0] = 0  # the null block
    tables = {"a": [5, 9, 2, 30, 31, 40, 41, 42], "b": [7, 8, 12, 13, 14, 15, 16, 17]}
    lens = {"a": 6, "b": 11}
    backend = TorchGroupedBackend()
    extensions = 0
    for step in range(24):
        if step == 12:  # a request leaves: the next step must gather afresh
            del tables["b"], lens["b"]
        requests = [(lens[r], 1, tables[r][: (lens[r] + BLOCK_SIZE) // BLOCK_SIZE]) for r in lens]
        out, expected, metadata = _step(backend, cache, requests, generator)
        torch.testing.assert_close(out, expected)
        extensions += sum(b.is_extension for b in metadata.decode_buckets)
        if step == 12:
            assert not any(b.is_extension for b in metadata.decode_buckets)
        for r in lens:
            lens[r] += 1
    assert extensions >= 12  # steady steps really extended instead of gathering


def test_extension_matches_dense_attention():
    generator = torch.Generator().manual_seed(1)
    cache = torch.zeros(2, 32, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    blocks = [3, 4, 5, 6, 7]
    keys = torch.randn(20, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    values = torch.randn(20, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    backend = TorchGroupedBackend()
    for length in range(5, 12):
        common = make_common_metadata([(length, 1, blocks)], BLOCK_SIZE)
        metadata = backend.build_metadata(common, BLOCK_SIZE)
        for pos in range(length + 1):  # what earlier steps stored
            slot = blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
            cache[0].view(-1, NUM_KV_HEADS, HEAD_SIZE)[slot] = keys[pos]
            cache[1].view(-1, NUM_KV_HEADS, HEAD_SIZE)[slot] = values[pos]
        q = torch.randn(1, NUM_HEADS, HEAD_SIZE, generator=generator)
        out = backend.forward(
            q, keys[length : length + 1], values[length : length + 1], cache, metadata,
            HEAD_SIZE**-0.5,
        )
        expected = dense_causal_attention(
            q, keys[: length + 1], values[: length + 1], length, HEAD_SIZE**-0.5
        )
        torch.testing.assert_close(out, expected)
