"""Penalties, logit bias, allowed tokens and bad words against a plain per-row reference.

The reference applies each adjustment to one row at a time with Python loops, in vLLM's
order (masks, bias, repetition, frequency / presence); the batched implementation must give
the same logits for a batch mixing rows that use every combination of them.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from pagedllm.layers.logits_processors import LogitsProcessors
from pagedllm.layers.sampler import Sampler, SamplingMetadata
from pagedllm.sampling_params import SamplingParams

VOCAB = 50


def _reference_row(
    logits: list[float], params: SamplingParams, token_ids: list[int], num_prompt: int
) -> list[float]:
    out = list(logits)
    prompt, output = token_ids[:num_prompt], token_ids[num_prompt:]
    if params.allowed_token_ids:
        out = [v if t in params.allowed_token_ids else -math.inf for t, v in enumerate(out)]
    for word in params.bad_words_token_ids or []:
        prefix = word[:-1]
        if len(prefix) <= len(output) and (not prefix or output[-len(prefix) :] == prefix):
            out[word[-1]] = -math.inf
    for token_id, bias in (params.logit_bias or {}).items():
        out[token_id] += bias
    seen = set(prompt) | set(output)
    for t in range(len(out)):
        if t in seen:
            p = params.repetition_penalty
            out[t] = out[t] / p if out[t] > 0 else out[t] * p
        count = output.count(t)
        out[t] -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
    return out


def _random_row_params(rng: random.Random) -> SamplingParams:
    kwargs: dict = {}
    if rng.random() < 0.5:
        kwargs["repetition_penalty"] = rng.choice([0.5, 1.3, 2.0])
    if rng.random() < 0.5:
        kwargs["frequency_penalty"] = rng.uniform(-2, 2)
    if rng.random() < 0.5:
        kwargs["presence_penalty"] = rng.uniform(-2, 2)
    if rng.random() < 0.3:
        kwargs["logit_bias"] = {rng.randrange(VOCAB): rng.uniform(-5, 5) for _ in range(3)}
    if rng.random() < 0.2:
        kwargs["allowed_token_ids"] = rng.sample(range(VOCAB), 5)
    params = SamplingParams(temperature=0.0, **kwargs)
    if rng.random() < 0.4:
        params.bad_words_token_ids = [[rng.randrange(VOCAB)], [rng.randrange(VOCAB), 7, 9]]
    return params


@pytest.mark.parametrize("seed", range(6))
def test_batched_equals_per_row_reference(seed: int) -> None:
    rng = random.Random(seed)
    batch = 8
    params = [_random_row_params(rng) for _ in range(batch)]
    token_ids, num_prompt = [], []
    for _ in range(batch):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
        # Some outputs end in the bad word's prefix (7, 9) so multi-token words trigger.
        output = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 10))]
        if rng.random() < 0.5:
            output += [7, 9]
        token_ids.append(prompt + output)
        num_prompt.append(len(prompt))
    logits = torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    original = logits.clone()
    processors = LogitsProcessors.build(params, token_ids, num_prompt, torch.device("cpu"))
    got = processors.apply(logits) if processors is not None else logits
    expected = torch.tensor(
        [
            _reference_row(logits[i].tolist(), params[i], token_ids[i], num_prompt[i])
            for i in range(batch)
        ]
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(logits, original), "the caller's logits must not change"


def test_no_adjustments_builds_nothing() -> None:
    params = [SamplingParams(temperature=0.0)] * 3
    assert LogitsProcessors.build(params, None, None, torch.device("cpu")) is None


def test_repetition_penalty_hf_semantics_prompt_included() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0)]
    # Token 0 only in the prompt, token 1 only in the output: both penalised.
    processors = LogitsProcessors.build(params, [[0, 3, 1]], [2], torch.device("cpu"))
    assert processors is not None
    got = processors.apply(logits)
    assert got.tolist() == [[1.0, -4.0, 1.0, 0.25]]


def test_presence_and_frequency_count_output_tokens_only() -> None:
    logits = torch.zeros(1, 4)
    params = [SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25)]
    processors = LogitsProcessors.build(params, [[2, 2, 1, 1, 1]], [2], torch.device("cpu"))
    assert processors is not None
    # Prompt [2, 2] does not count; output [1, 1, 1]: 0.5 + 3 * 0.25.
    assert processors.apply(logits).tolist() == [[0.0, -1.25, 0.0, 0.0]]


def test_sampler_applies_adjustments_to_greedy_and_random_rows() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0], [5.0, 1.0, 0.0], [5.0, 1.0, 0.0]])
    params = [
        SamplingParams(temperature=0.0, logit_bias={2: 10.0}),
        SamplingParams(temperature=0.0, allowed_token_ids=[1]),
        SamplingParams(temperature=1.0, seed=1, allowed_token_ids=[2]),
    ]
    metadata = SamplingMetadata.build(
        params, [0, 0, 0], [None, None, None], "cpu", [[0], [0], [0]], [1, 1, 1]
    )
    assert Sampler()(logits, metadata).tolist() == [2, 1, 2]


def test_bad_words_ban_only_after_their_prefix() -> None:
    params = SamplingParams(temperature=0.0)
    params.bad_words_token_ids = [[4, 0]]
    logits = torch.tensor([[9.0, 1.0, 0.0, 0.0, 0.0]] * 2)
    metadata = SamplingMetadata.build(
        [params, params], [1, 1], [None, None], "cpu", [[3, 4], [3, 2]], [1, 1]
    )
    # Row 0's output ends in the prefix [4]: token 0 is banned; row 1's does not.
    assert Sampler()(logits, metadata).tolist() == [1, 0]
