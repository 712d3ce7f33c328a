"""Sampler tests: greedy exactness, truncation filters, seeded determinism, min_tokens."""

from __future__ import annotations

import math

import pytest
import torch

import pagedllm.layers.sampler as sampler_module
from pagedllm.layers.sampler import Sampler, SamplingMetadata, derive_seed
from pagedllm.sampling_params import SamplingParams

EOS = 2


def _sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    num_output_tokens: list[int] | None = None,
    eos_token_ids: list[int | None] | None = None,
) -> torch.Tensor:
    batch_size = logits.shape[0]
    metadata = SamplingMetadata.build(
        params,
        num_output_tokens if num_output_tokens is not None else [0] * batch_size,
        eos_token_ids if eos_token_ids is not None else [EOS] * batch_size,
        "cpu",
    )
    return Sampler()(logits, metadata)


def _random_logits(batch_size: int, vocab_size: int, seed: int = 0, scale: float = 3.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, vocab_size, generator=generator) * scale


def _reference_allowed(logits_row: torch.Tensor, params: SamplingParams) -> set[int]:
    """Tokens that top-k, then top-p, then min-p keep, computed the slow obvious way."""
    probs = torch.softmax(logits_row.double() / params.temperature, dim=-1)
    order = sorted(range(len(probs)), key=lambda i: -float(probs[i]))
    if params.top_k > 0:
        order = order[: params.top_k]
    total = sum(float(probs[i]) for i in order)
    if params.top_p < 1.0:
        kept, mass = [], 0.0
        for i in order:
            if mass >= params.top_p * total - 1e-9:
                break
            kept.append(i)
            mass += float(probs[i])
        order = kept
    p_max = float(probs[order[0]])
    return {i for i in order if float(probs[i]) >= params.min_p * p_max - 1e-12}


def test_greedy_equals_argmax() -> None:
    logits = _random_logits(16, 1000)
    tokens = _sample(logits, [SamplingParams(temperature=0.0)] * 16)
    assert tokens.dtype == torch.int64
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_greedy_rows_in_mixed_batch_equal_argmax() -> None:
    logits = _random_logits(12, 500, seed=1)
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, top_p=0.8) for i in range(12)]
    tokens = _sample(logits, params)
    argmax = logits.argmax(dim=-1)
    assert torch.equal(tokens[1::2], argmax[1::2])


def test_logits_not_modified() -> None:
    logits = _random_logits(4, 300)
    before = logits.clone()
    params = [SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, min_tokens=3)] * 4
    _sample(logits, params)
    assert torch.equal(logits, before)


def test_top_k_one_equals_greedy() -> None:
    logits = _random_logits(32, 2000, seed=2)
    params = [
        SamplingParams(temperature=1.5, top_k=1, seed=i if i % 2 else None) for i in range(32)
    ]
    assert torch.equal(_sample(logits, params), logits.argmax(dim=-1))


def test_metadata_skips_unused_features() -> None:
    params = [SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2, seed=3)] * 3
    metadata = SamplingMetadata.build(params, [0, 0, 0], [EOS] * 3, "cpu")
    assert metadata.all_greedy and not metadata.all_random
    assert metadata.top_k is None and metadata.top_p is None and metadata.min_p is None
    assert metadata.generators == {} and metadata.min_tokens_mask is None

    params = [SamplingParams(), SamplingParams(top_k=7, seed=1), SamplingParams(temperature=0)]
    metadata = SamplingMetadata.build(params, [0, 0, 0], [EOS] * 3, "cpu")
    assert not metadata.all_greedy and not metadata.all_random
    assert metadata.top_k is not None and metadata.top_k.tolist() == [0, 7, 0]
    assert metadata.max_top_k == 7
    assert metadata.top_p is None and metadata.min_p is None
    assert set(metadata.generators) == {1}
    assert metadata.temperature.dtype == torch.float32


def _seeded_stream(
    row_logits: torch.Tensor, params: SamplingParams, num_steps: int, layout: int
) -> list[int]:
    """Sample `num_steps` tokens for one seeded request inside different batches."""
    tokens = []
    for step in range(num_steps):
        batch_size = 3 + layout * 2
        others = _random_logits(batch_size, row_logits.shape[0], seed=100 * layout + step)
        row = (layout * 3 + step) % batch_size
        others[row] = row_logits
        batch_params = [
            SamplingParams(temperature=0.9, top_p=0.95, seed=(i if layout % 2 else None))
            if i % 3
            else SamplingParams(temperature=0.0)
            for i in range(batch_size)
        ]
        batch_params[row] = params
        num_output_tokens = [layout + i for i in range(batch_size)]
        num_output_tokens[row] = step
        tokens.append(int(_sample(others, batch_params, num_output_tokens)[row]))
    return tokens


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=1234),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, seed=7),
    ],
)
def test_seeded_reproducible_across_batches(params: SamplingParams) -> None:
    row_logits = _random_logits(1, 3000, seed=5, scale=1.0)[0]
    streams = [_seeded_stream(row_logits, params, 12, layout) for layout in range(4)]
    assert all(stream == streams[0] for stream in streams[1:])
    # A preempted request recomputes from output position 5: it samples the same tokens.
    metadata = SamplingMetadata.build([params], [5], [EOS], "cpu")
    assert int(Sampler()(row_logits.unsqueeze(0), metadata)[0]) == streams[0][5]


def test_different_seeds_differ() -> None:
    row_logits = torch.zeros(1, 1000)
    streams = []
    for seed in (1, 2):
        params = SamplingParams(temperature=1.0, seed=seed)
        streams.append([int(_sample(row_logits, [params], [step])[0]) for step in range(10)])
    assert streams[0] != streams[1]
    # Different positions of one seed draw different noise too.
    assert len(set(streams[0])) > 1
    assert derive_seed(1, 0) != derive_seed(1, 1) != derive_seed(2, 1)


def test_unseeded_rows_vary() -> None:
    logits = torch.zeros(2, 1000)
    draws = {tuple(_sample(logits, [SamplingParams()] * 2).tolist()) for _ in range(5)}
    assert len(draws) > 1


@pytest.mark.parametrize("vocab_size", [300, 20000])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=0.7, top_p=0.6),
        SamplingParams(temperature=1.3, min_p=0.2),
        SamplingParams(temperature=1.0, top_k=40, top_p=0.8, min_p=0.05),
        SamplingParams(temperature=2.0, top_p=0.95),
    ],
    ids=["top_k", "top_p", "min_p", "all", "flat_top_p"],
)
def test_filters_never_sample_excluded_tokens(vocab_size: int, params: SamplingParams) -> None:
    num_rows = 4
    # Row scales from peaked to nearly flat, so CPU top-p also takes its full-sort fallback.
    logits = torch.cat(
        [
            _random_logits(1, vocab_size, seed=10 + i, scale=scale)
            for i, scale in enumerate([4.0, 2.0, 0.5, 0.05])
        ]
    )
    allowed = [_reference_allowed(logits[i], params) for i in range(num_rows)]
    repeats = 400 if vocab_size < 1000 else 40
    batch = logits.repeat(repeats, 1)  # [num_rows * repeats, V]
    other = SamplingParams(temperature=1.0)
    mixed = [params if i % 2 == 0 else other for i in range(num_rows)] * repeats
    for batch_params in ([params] * batch.shape[0], mixed):
        tokens = _sample(batch, batch_params).tolist()
        for i, token in enumerate(tokens):
            if batch_params[i] is params:
                assert token in allowed[i % num_rows], (i % num_rows, token)


def _frequencies(logits_row: torch.Tensor, params: SamplingParams, num: int) -> torch.Tensor:
    tokens = _sample(logits_row.repeat(num, 1), [params] * num)
    return torch.bincount(tokens, minlength=logits_row.shape[0]).double() / num


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=1.0, min_p=0.3),
    ],
    ids=["t1", "t0.5", "top_k3", "top_p0.7", "min_p0.3"],
)
def test_sampling_frequencies_match_softmax(params: SamplingParams) -> None:
    logits_row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])
    probs = torch.softmax(logits_row.double() / params.temperature, dim=-1)
    keep = torch.zeros(6, dtype=torch.bool)
    keep[sorted(_reference_allowed(logits_row, params))] = True
    probs = torch.where(keep, probs, 0.0)
    probs /= probs.sum()
    freqs = _frequencies(logits_row, params, 40000)
    # 40k draws: one standard deviation is at most 0.0025.
    assert torch.allclose(freqs, probs, atol=0.012), (freqs, probs)


def test_seeded_frequencies_match_softmax() -> None:
    """Derived per-position generators are still an unbiased sampler."""
    logits_row = torch.tensor([[1.0, 0.0, -0.5, 0.5]])
    probs = torch.softmax(logits_row[0].double(), dim=-1)
    num = 4000
    params = SamplingParams(temperature=1.0, seed=99)
    metadata = SamplingMetadata.build([params] * num, list(range(num)), [None] * num, "cpu")
    tokens = Sampler()(logits_row.repeat(num, 1), metadata)
    freqs = torch.bincount(tokens, minlength=4).double() / num
    assert torch.allclose(freqs, probs, atol=0.03), (freqs, probs)


def test_temperature_affects_spread() -> None:
    logits_row = _random_logits(1, 50, seed=3, scale=1.0)[0]
    cold = _frequencies(logits_row, SamplingParams(temperature=0.1), 5000)
    hot = _frequencies(logits_row, SamplingParams(temperature=3.0), 5000)
    top = int(logits_row.argmax())
    for freqs, temperature in ((cold, 0.1), (hot, 3.0)):
        expected = torch.softmax(logits_row.double() / temperature, dim=-1)
        assert abs(float(freqs[top] - expected[top])) < 0.03
    assert cold[top] > hot[top] + 0.5
    assert int((hot > 0).sum()) > 3 * int((cold > 0).sum())


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    vocab_size = 20
    logits = torch.zeros(4, vocab_size)
    logits[:, EOS] = 100.0
    logits[:, 7] = 90.0
    logits[:, 11] = 80.0
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[7])
    random_params = SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[7], seed=0)
    # Rows 0-1: below min_tokens (EOS and 7 banned); rows 2-3: min_tokens reached.
    tokens = _sample(logits, [params, random_params, params, random_params], [0, 2, 3, 5])
    assert tokens.tolist() == [11, 11, EOS, EOS]


def test_min_tokens_respects_ignore_eos_and_missing_eos() -> None:
    logits = torch.zeros(2, 10)
    logits[:, EOS] = 100.0
    params = [
        SamplingParams(temperature=0.0, min_tokens=4, ignore_eos=True),
        SamplingParams(temperature=0.0, min_tokens=4),
    ]
    # ignore_eos: EOS does not stop the request, so it is not banned; no EOS id: nothing to ban.
    assert _sample(logits, params, [0, 0], [EOS, None]).tolist() == [EOS, EOS]
    metadata = SamplingMetadata.build(params, [0, 0], [EOS, None], "cpu")
    assert metadata.min_tokens_mask is None


def test_extreme_temperatures_stay_finite() -> None:
    logits = _random_logits(8, 400, seed=4, scale=50.0)
    params = [SamplingParams(temperature=t) for t in (0.01, 0.02, 100.0, 1e4)] * 2
    tokens = _sample(logits, params)
    assert ((tokens >= 0) & (tokens < 400)).all()
    # At the minimum temperature the race is effectively greedy on well-separated logits.
    assert int(tokens[0]) == int(logits[0].argmax())
    assert not math.isnan(float(logits.sum()))


def test_cpu_top_p_candidates_match_full_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU partial-selection path finds the same cut as one full sort of every row."""
    vocab_size = 20000
    scales = torch.tensor([5.0, 3.0, 1.0, 0.3, 0.05, 2.0, 0.5, 0.01])[:, None]
    logits = _random_logits(8, vocab_size, seed=21, scale=1.0) * scales
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    k = torch.tensor([vocab_size, 30, 6000, vocab_size, 9000, vocab_size, 12000, 4096])
    top_p = torch.tensor([0.9, 0.5, 0.99, 1.0, 1.0, 0.3, 0.95, 0.7])
    fast = sampler_module._top_k_top_p_threshold(weights, k, top_p)
    monkeypatch.setattr(sampler_module, "_TOP_P_CANDIDATES", vocab_size)
    full = sampler_module._top_k_top_p_threshold(weights, k, top_p)
    assert torch.equal(fast, full)
