"""max_logprobs (vLLM's --max-logprobs): the engine refuses a request asking for more sample
or prompt logprobs, a request's -1 counting as the whole vocabulary; -1 lifts the limit."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

PROMPT = {"prompt_token_ids": [1, 5, 9, 14]}


@pytest.fixture(scope="module")
def llm(tiny_llama_dir) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64)


@pytest.mark.parametrize(("fields", "message"), [
    ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ({"prompt_logprobs": 30}, "Requested prompt logprobs of 30, which is greater than max"),
    ({"prompt_logprobs": -1}, "Requested prompt logprobs of .*greater than max allowed: 20"),
])
def test_above_the_default_limit_is_refused(llm, fields, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([PROMPT], SamplingParams(max_tokens=2, **fields))
    # Nothing was left behind: the next request runs.
    assert llm.generate([PROMPT], SamplingParams(max_tokens=2, logprobs=20))[0].outputs


def test_minus_one_lifts_the_limit(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64, max_logprobs=-1)
    vocab = llm.llm_engine.engine_config.model_config.hf_config.vocab_size
    out = llm.generate([PROMPT], SamplingParams(max_tokens=2, logprobs=30,
                                                 prompt_logprobs=-1))[0]
    assert len(out.outputs[0].logprobs[0]) >= 30
    assert len(out.prompt_logprobs[1]) == vocab
