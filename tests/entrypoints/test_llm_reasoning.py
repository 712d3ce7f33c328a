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


# A Qwen3-style template: `enable_thinking: false` closes an empty reasoning block in the
# prompt, and the whole reply is then the answer.
QWEN3_STYLE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def test_enable_thinking_false_makes_the_reply_all_answer(scripted):
    engine = LLM(str(scripted[0]), reasoning_parser="qwen3", max_model_len=256,
                 num_gpu_blocks_override=64)
    try:
        params = SamplingParams(temperature=0, max_tokens=12)
        off = engine.chat(MESSAGES, params, use_tqdm=False, chat_template=QWEN3_STYLE,
                          chat_template_kwargs={"enable_thinking": False})[0]
        assert off.prompt.endswith("<think>\n\n</think>\n\n")
        seq = off.outputs[0]
        assert seq.reasoning is None and seq.content == seq.text
        # Constrained, the answer is held from its first token (nothing to wait for).
        constrained = engine.chat(
            MESSAGES, SamplingParams(temperature=0, max_tokens=12,
                                     structured_outputs=StructuredOutputsParams(
                                         choice=["yes", "no"])),
            use_tqdm=False, chat_template=QWEN3_STYLE,
            chat_template_kwargs={"enable_thinking": False})[0].outputs[0]
        assert constrained.reasoning is None and constrained.content in ("yes", "no")
    finally:
        engine.llm_engine.shutdown()
