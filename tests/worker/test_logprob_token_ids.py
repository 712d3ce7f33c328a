"""logprob_token_ids (vLLM's): each generated token's logprobs for the listed token ids, with
their true ranks, equal to the same entries of the whole-vocabulary logprobs; refused above
max_logprobs or outside the vocabulary."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

PROMPTS = [{"prompt_token_ids": [1, 5, 9, 14]}, {"prompt_token_ids": [3, 8, 2]}]
LISTED = [7, 100, 3, 42]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64, max_logprobs=-1)


def test_listed_logprobs_are_the_full_distributions_entries(llm):
    listed = SamplingParams(max_tokens=4, temperature=0, logprob_token_ids=LISTED)
    full = SamplingParams(max_tokens=4, temperature=0, logprobs=-1)
    # Mixed in one batch with a plain request: each gets its own kind of logprobs.
    outs = llm.generate(PROMPTS, [listed, full])
    whole = llm.generate(PROMPTS[:1], full)[0].outputs[0]
    seq = outs[0].outputs[0]
    assert seq.token_ids == whole.token_ids
    for token, position, reference in zip(seq.token_ids, seq.logprobs, whole.logprobs,
                                          strict=True):
        assert set(position) == {token, *LISTED}
        for token_id, entry in position.items():
            assert entry.logprob == pytest.approx(reference[token_id].logprob, abs=1e-5)
            assert entry.rank == reference[token_id].rank
    vocab = llm.llm_engine.engine_config.model_config.hf_config.vocab_size
    assert len(outs[1].outputs[0].logprobs[0]) == vocab  # the other request: whole vocabulary


def test_listed_ids_are_checked(llm, tiny_llama_dir):
    vocab = llm.llm_engine.engine_config.model_config.hf_config.vocab_size
    with pytest.raises(ValueError, match="logprob_token_ids"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2, logprob_token_ids=[vocab]))
    with pytest.raises(ValueError, match="logprob_token_ids"):
        SamplingParams(logprob_token_ids=[])
    limited = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64, max_logprobs=3)
    with pytest.raises(ValueError, match="greater than max allowed: 3"):
        limited.generate(PROMPTS[:1], SamplingParams(max_tokens=2, logprob_token_ids=LISTED))
