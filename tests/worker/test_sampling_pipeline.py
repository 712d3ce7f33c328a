"""Which steps the sampling pipeline serves from each row's argmax alone (no sampling
metadata, no [rows, vocab] logits): greedy rows without logprobs, logits adjustments or a
min_tokens ban in force."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pagedllm import SamplingParams
from pagedllm.worker.sampling import only_argmax

EOS = 2


def _state(num_output_tokens: int = 0, **params) -> SimpleNamespace:
    return SimpleNamespace(sampling_params=SamplingParams(**params),
                           num_output_tokens=num_output_tokens, eos_token_id=EOS)


def test_plain_greedy_rows_need_only_their_argmax():
    assert only_argmax(_state(temperature=0.0))
    assert only_argmax(_state(temperature=0.0, ignore_eos=True, min_tokens=5))  # nothing banned
    assert only_argmax(_state(5, temperature=0.0, min_tokens=5))  # min_tokens reached


@pytest.mark.parametrize("params", [
    {"temperature": 0.7},
    {"temperature": 0.0, "logprobs": 0},
    {"temperature": 0.0, "logit_bias": {5: 1.0}},
    {"temperature": 0.0, "allowed_token_ids": [5, 6]},
    {"temperature": 0.0, "bad_words": ["x"]},
    {"temperature": 0.0, "repetition_penalty": 1.2},
    {"temperature": 0.0, "presence_penalty": 0.5},
    {"temperature": 0.0, "min_tokens": 5},  # EOS banned before it
    {"temperature": 0.0, "ignore_eos": True, "min_tokens": 5, "stop_token_ids": [7]},
], ids=["random", "logprobs", "bias", "allowed", "bad-words", "repetition", "presence",
        "min-tokens-eos", "min-tokens-stop"])
def test_rows_that_need_more_than_the_argmax(params):
    state = _state(**params)
    if params.get("bad_words"):  # tokenized by the engine's processor
        state.sampling_params.bad_words_token_ids = [[9]]
    assert not only_argmax(state)
