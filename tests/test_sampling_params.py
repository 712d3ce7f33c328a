"""SamplingParams validation: every bad field raises ValueError naming the field."""

from __future__ import annotations

import pytest

from pagedllm import SamplingParams


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n": 0}, "n"),
        ({"n": 1.5}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.1}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop": [3]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": "x"}, "seed"),
        ({"n": 2, "temperature": 0.0}, "n"),
    ],
)
def test_invalid_fields(kwargs, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        SamplingParams(**kwargs)


def test_defaults_and_normalisation():
    params = SamplingParams(stop="###", temperature=0.001)
    assert params.stop == ["###"] and params.stop_token_ids == []
    assert params.temperature == 0.01  # clamped like vLLM, not greedy
    assert not params.is_greedy and SamplingParams(temperature=0).is_greedy
    assert params.output_text_buffer_length == 2
    assert (
        SamplingParams(stop="###", include_stop_str_in_output=True).output_text_buffer_length == 0
    )
    assert SamplingParams().max_tokens == 16


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"logprobs": -2}, "logprobs must be non-negative or -1, got -2."),
        ({"logprobs": 1.5}, "logprobs must be non-negative or -1"),
        ({"prompt_logprobs": -3}, "prompt_logprobs must be non-negative or -1, got -3."),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\], got 2.5."),
        ({"frequency_penalty": -2.1}, r"frequency_penalty must be in \[-2, 2\], got -2.1."),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero, got 0.0."),
        ({"repetition_penalty": float("inf")}, "repetition_penalty must be greater than zero"),
        ({"allowed_token_ids": []}, "allowed_token_ids is not None and empty!"),
        ({"allowed_token_ids": [-1]}, "allowed_token_ids must be non-negative integers"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias must map token ids to numbers"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias keys must be non-negative token ids"),
        ({"bad_words": [""]}, "bad_words must be non-empty strings"),
        ({"n": 3, "best_of": 2}, "best_of must be greater than or equal to n, got n=3 and best_of"),
        ({"best_of": 2, "temperature": 0.0}, "best_of must be 1 when using greedy sampling, got 2"),
        ({"best_of": "2"}, "best_of must be an int"),
    ],
)
def test_invalid_logprobs_penalty_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_logprobs_penalty_fields_normalised():
    params = SamplingParams(
        logprobs=-1,
        prompt_logprobs=20,
        logit_bias={"7": 250, 3: -1000.0},
        bad_words="darn",
        allowed_token_ids=(1, 2),
        n=2,
        best_of=3,
    )
    assert params.logit_bias == {7: 100.0, 3: -100.0}  # keys parsed, values clamped
    assert params.bad_words == ["darn"] and params.allowed_token_ids == [1, 2]
    assert params.num_sequences == 3 and SamplingParams(n=2).num_sequences == 2
    assert params.skip_reading_prefix_cache and not SamplingParams().skip_reading_prefix_cache
    assert SamplingParams(repetition_penalty=1.1).has_penalties
    assert not SamplingParams().has_penalties


def test_n_and_best_of_are_bounded_like_vllm(monkeypatch):
    """A huge `n` (found by fuzzing the server: n=302733 ran for minutes) is refused; the
    bound is PAGEDLLM_MAX_N_SEQUENCES (vLLM's VLLM_MAX_N_SEQUENCES, default 16384)."""
    with pytest.raises(ValueError, match="n must be at most 16384, got 302733"):
        SamplingParams(n=302733, temperature=1.0)
    monkeypatch.setenv("PAGEDLLM_MAX_N_SEQUENCES", "8")
    SamplingParams(n=8, temperature=1.0)
    with pytest.raises(ValueError, match="n must be at most 8"):
        SamplingParams(n=9, temperature=1.0)
    with pytest.raises(ValueError, match="best_of must be at most 8"):
        SamplingParams(n=2, best_of=9, temperature=1.0)
