"""Where dense bf16 weights beat W4A8 (layers/quantization/crossover.py): the choice from timings,
the override, and the measurement itself on this CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pagedllm import envs
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import crossover as dense_crossover
from pagedllm.layers.quantization.crossover import CANDIDATE_TOKENS, choose_dense_from
from pagedllm.platform.cpu_plan import cpu_plan


@pytest.mark.parametrize(
    ("speedups", "want"),
    [
        # Vector units (AVX-512 BF16): W4A8 2-3x faster everywhere.
        ({8: 0.3, 16: 0.3, 32: 0.35, 64: 0.35, 128: 0.36}, None),
        # Matrix units (AMX), as measured on a Sapphire Rapids VM.
        ({8: 0.61, 16: 1.07, 32: 1.83, 64: 2.97, 128: 3.85}, 32),
        # Dense wins everywhere.
        ({8: 1.5, 16: 2.0, 32: 2.5, 64: 3.0, 128: 3.5}, 8),
        # A win at one size that does not hold at larger ones is noise, not a crossover.
        ({8: 0.5, 16: 1.5, 32: 1.1, 64: 1.0, 128: 0.9}, None),
        ({8: 0.5, 16: 1.5, 32: 1.1, 64: 1.3, 128: 1.4}, 64),
    ],
)
def test_crossover_is_where_dense_wins_by_the_margin_from_then_on(speedups, want):
    timings = {tokens: (speedup, 1.0) for tokens, speedup in speedups.items()}
    assert choose_dense_from(timings) == want


@pytest.mark.parametrize(
    ("value", "want"), [("", "auto"), ("auto", "auto"), ("never", "never"), ("24", 24)]
)
def test_override_is_parsed(monkeypatch, value, want):
    monkeypatch.setenv("PAGEDLLM_DENSE_FROM_TOKENS", value)
    assert envs.dense_from_tokens() == want


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_bad_override_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("PAGEDLLM_DENSE_FROM_TOKENS", value)
    with pytest.raises(ValueError, match="PAGEDLLM_DENSE_FROM_TOKENS"):
        envs.dense_from_tokens()


def test_override_wins_over_the_measurement(dense_from_tokens, monkeypatch):
    monkeypatch.setattr(dense_crossover, "measure_timings", lambda: pytest.fail("measured"))
    dense_from_tokens("12")
    assert dense_crossover.dense_from_tokens() == 12
    dense_from_tokens("never")
    assert dense_crossover.dense_from_tokens() is None


@pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no C compiler")
def test_measurement_here(dense_from_tokens):
    """Both matmuls are timed at every candidate size; without native bf16 dense is never
    chosen (it would be emulated), so nothing is measured."""
    dense_from_tokens("auto")
    chosen = dense_crossover.dense_from_tokens()
    if not cpu_plan().native_bf16:
        assert chosen is None
        return
    timings = dense_crossover.measure_timings()
    assert sorted(timings) == list(CANDIDATE_TOKENS)
    assert all(q > 0 and d > 0 for q, d in timings.values())
    assert chosen is None or chosen in CANDIDATE_TOKENS


def test_two_calls_are_timed_in_turn_and_each_keeps_its_best(monkeypatch):
    """paired_best_times alternates the two calls (so a burst of another process slows
    both alike) for at least the rounds and seconds asked, after one untimed call each."""
    calls: list[str] = []
    # Each call of either side advances a fake clock: first 1 unit, second 3 units.
    now = [0.0]

    def first():
        calls.append("a")
        now[0] += 1.0

    def second():
        calls.append("b")
        now[0] += 3.0

    monkeypatch.setattr(dense_crossover, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    best = dense_crossover.paired_best_times(first, second, min_rounds=3, min_seconds=0.0)
    assert best == (1.0, 3.0)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    calls.clear()
    dense_crossover.paired_best_times(first, second, min_rounds=1, min_seconds=10.0)
    assert calls == ["a", "b"] * 4  # warm-up, then rounds until 10 units have passed
