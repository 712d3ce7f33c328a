"""N-gram lookup: the batched search equals a plain per-request search."""

from __future__ import annotations

import random

import numpy as np

from pagedllm.spec_decode.ngram_proposer import NgramProposer, propose_ngram


def _reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The latest earlier occurrence of the longest suffix (preferring one followed by k
    tokens), searched position by position."""
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]
        full = [s for s in starts if s + n + k <= len(tokens)]
        if full or starts:
            start = max(full or starts)
            return tokens[start + n : start + n + k]
    return []


def test_matches_the_reference_on_random_histories():
    rng = random.Random(0)
    histories = []
    for _ in range(64):
        vocab = rng.choice([3, 5, 50])  # small vocabularies repeat often
        histories.append([rng.randrange(vocab) for _ in range(rng.randrange(1, 300))])
    for k, min_n, max_n in ((5, 1, 3), (3, 2, 5), (1, 4, 4)):
        got = propose_ngram([np.array(h) for h in histories], k, min_n, max_n)
        assert got == [_reference(h, k, min_n, max_n) for h in histories]
    assert any(got)


def test_longest_match_wins_and_latest_occurrence():
    # "1 2 3" occurs twice, and its suffix "2 3" once more, later: n=3 wins over n=2.
    tokens = [1, 2, 3, 7, 8, 1, 2, 3, 9, 5, 2, 3, 4, 4, 1, 2, 3]
    assert propose_ngram([np.array(tokens)], 2, 2, 3) == [[9, 5]]
    assert propose_ngram([np.array(tokens)], 2, 2, 2) == [[4, 4]]
    # A match right before the end proposes what there is.
    assert propose_ngram([np.array([5, 6, 5, 6])], 4, 1, 2) == [[5, 6]]
    # Inside a run, the latest occurrence followed by k tokens.
    assert propose_ngram([np.array([3] + [4] * 6)], 3, 2, 2) == [[4, 4, 4]]
    assert propose_ngram([np.array([1, 2, 3])], 4, 1, 2) == [[]]


def test_proposer_keeps_histories_incrementally():
    proposer = NgramProposer(num_speculative_tokens=3, min_n=1, max_n=2)
    tokens = [4, 5, 6, 4, 5]
    assert proposer.propose(["a"], [tokens]) == [[6, 4, 5]]
    tokens += [6, 9]  # appended by the worker
    assert proposer.propose(["a"], [tokens]) == [[]]
    tokens += [4] * 200  # grows past the buffer
    assert proposer.propose(["a"], [tokens]) == [[4, 4, 4]]
    proposer.forget(["a"])
    assert proposer.propose(["a"], [[1, 2, 1]]) == [[2, 1]]
