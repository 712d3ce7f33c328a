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
    assert SamplingParams(stop="###", include_stop_str_in_output=True).output_text_buffer_length == 0
    assert SamplingParams().max_tokens == 16
