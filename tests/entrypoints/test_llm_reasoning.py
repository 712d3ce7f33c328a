"""LLM.chat with a reasoning parser (`LLM(reasoning_parser=...)`): each output carries the
split (`reasoning`, `content`) beside its whole `text`, and structured outputs constrain only
the answer after the reasoning, offline as in the server (the scripted model of
tests/entrypoints/openai/test_reasoning_server.py)."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.sampling_params import StructuredOutputsParams

from .openai.test_reasoning_server import make_scripted_model

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer_dir, tmp_path_factory):
    return make_scripted_model(tmp_path_factory.mktemp("thinker_llm"), tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def llm(scripted):
    engine = LLM(str(scripted[0]), reasoning_parser="deepseek_r1", max_model_len=256,
                 num_gpu_blocks_override=64)
    yield engine
    engine.llm_engine.shutdown()


def test_chat_outputs_carry_the_split(llm, scripted):
    words = scripted[1]
    seq = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=20),
                   use_tqdm=False)[0].outputs[0]
    assert seq.reasoning == words[0] + words[1] and seq.content == words[2] + words[3]
    assert seq.text == f"<think>{words[0]}{words[1]}</think>{words[2]}{words[3]}"


def test_constraints_hold_only_the_answer(llm, scripted):
    params = SamplingParams(temperature=0, max_tokens=20,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    seq = llm.chat(MESSAGES, params, use_tqdm=False)[0].outputs[0]
    assert seq.reasoning == scripted[1][0] + scripted[1][1]
    assert seq.content in ("yes", "no")


def test_without_a_parser_there_is_no_split(scripted):
    engine = LLM(str(scripted[0]), max_model_len=256, num_gpu_blocks_override=64)
    try:
        seq = engine.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=20),
                          use_tqdm=False)[0].outputs[0]
        assert seq.reasoning is None and seq.content is None and "</think>" in seq.text
    finally:
        engine.llm_engine.shutdown()


def test_unknown_parser_is_a_value_error(scripted):
    with pytest.raises(ValueError, match="Unknown reasoning parser 'nope'"):
        LLM(str(scripted[0]), reasoning_parser="nope")
