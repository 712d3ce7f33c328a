"""The rejection sampler: greedy verification is exact; random verification keeps the target
distribution (chi-square tests over 20,000 requests) and seeded rows replay."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from pagedllm.sampling_params import SamplingParams
from pagedllm.spec_decode.rejection_sampler import DraftLayout, RejectionSampler
from pagedllm.spec_decode.verify import build_verify_metadata

NUM_REQUESTS = 20_000
VOCAB = 8


def _verify(params, drafts, row_logits, draft_probs=None):
    """Run the sampler for requests whose rows all share `row_logits` ([m + 1, V])."""
    metadata = build_verify_metadata(
        params,
        [0] * len(params),
        [None] * len(params),
        [[1, 2]] * len(params),
        [2] * len(params),
        drafts,
        torch.device("cpu"),
    )
    layout = DraftLayout.build(drafts)
    logits = torch.cat([row_logits[: len(d) + 1] for d in drafts])
    return RejectionSampler()(logits, metadata, layout, draft_probs)


def _target_probs(row_logits: torch.Tensor, temperature: float) -> np.ndarray:
    return torch.softmax(row_logits / temperature, dim=-1).double().numpy()


def _assert_distributed_as(samples: list[int], probs: np.ndarray) -> None:
    counts = np.bincount(np.array(samples), minlength=len(probs))
    probs = probs / probs.sum()
    expected = probs * len(samples)
    kept = expected > 0
    assert counts[~kept].sum() == 0, "a token of probability 0 was sampled"
    expected = expected[kept] * counts[kept].sum() / expected[kept].sum()
    result = stats.chisquare(counts[kept], expected)
    assert result.pvalue > 0.01, (counts, expected)


def test_greedy_accepts_the_matching_prefix_then_the_argmax():
    row_logits = torch.full((4, VOCAB), -1.0)
    for row, best in enumerate([3, 5, 1, 6]):
        row_logits[row, best] = 2.0
    greedy = SamplingParams(temperature=0.0)
    drafts = [[3, 5, 1], [3, 4, 1], [7], []]
    got = _verify([greedy] * 4, drafts, row_logits)
    assert got == [[3, 5, 1, 6], [3, 5], [3], [3]]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_one_hot_drafts_keep_the_target_distribution(temperature):
    torch.manual_seed(0)
    row_logits = torch.randn(3, VOCAB) * 1.5
    params = [SamplingParams(temperature=temperature)] * NUM_REQUESTS
    drafts = [[2, 5]] * NUM_REQUESTS  # deterministic drafts, as n-gram lookup gives
    out = _verify(params, drafts, row_logits)
    p = [_target_probs(row_logits[i], temperature) for i in range(3)]
    _assert_distributed_as([o[0] for o in out], p[0])
    # Given the first draft was accepted, the second token follows the second row.
    _assert_distributed_as([o[1] for o in out if o[0] == 2], p[1])
    # Given both were accepted, the bonus follows the third row.
    _assert_distributed_as([o[2] for o in out if o[:2] == [2, 5]], p[2])
    accepted = sum(o[0] == 2 for o in out) / NUM_REQUESTS
    assert accepted == pytest.approx(p[0][2], abs=0.02)


def test_sampled_drafts_with_their_probs_keep_the_target_distribution():
    generator = torch.Generator().manual_seed(1)
    row_logits = torch.randn(2, VOCAB, generator=generator)
    draft_logits = torch.randn(VOCAB, generator=generator)
    q = torch.softmax(draft_logits, dim=-1)
    drafts_t = torch.multinomial(q, NUM_REQUESTS, replacement=True, generator=generator)
    drafts = [[int(t)] for t in drafts_t]
    draft_probs = q.expand(NUM_REQUESTS, VOCAB).contiguous()
    params = [SamplingParams(temperature=1.0)] * NUM_REQUESTS
    out = _verify(params, drafts, row_logits, draft_probs)
    _assert_distributed_as([o[0] for o in out], _target_probs(row_logits[0], 1.0))


def test_top_k_filters_apply_to_the_target():
    torch.manual_seed(2)
    row_logits = torch.randn(2, VOCAB)
    params = [SamplingParams(temperature=1.0, top_k=3)] * NUM_REQUESTS
    out = _verify(params, [[0]] * NUM_REQUESTS, row_logits)
    probs = _target_probs(row_logits[0], 1.0)
    probs[np.argsort(probs)[:-3]] = 0.0
    _assert_distributed_as([o[0] for o in out], probs / probs.sum())


def test_seeded_rows_replay_and_mixed_rows_keep_greedy_exact():
    torch.manual_seed(3)
    row_logits = torch.randn(4, VOCAB)
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(64)]
    drafts = [[1, 2, 3]] * 64
    first = _verify(params, drafts, row_logits)
    assert _verify(params, drafts, row_logits) == first
    assert len({tuple(o) for o in first}) > 1
    mixed = [SamplingParams(temperature=0.0), *params[1:]]
    again = _verify(mixed, drafts, row_logits)
    assert again[1:] == first[1:]
    greedy_first = int(row_logits[0].argmax())
    assert again[0][0] == greedy_first
