"""Prompts given as embeddings (vLLM's prompt_embeds): greedy float32 tokens equal
transformers' `generate(inputs_embeds=...)`, alone or batched with text prompts, chunked
(small step budgets), for a rotary model and one with learned positions (GPT-2, whose
positions are added to the given rows); the same embeddings share prefix-cache blocks and
others never do; bad tensors are ValueErrors naming prompt_embeds."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from pagedllm import LLM, SamplingParams
from tests.models.test_model_parity import save_random

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory):
    config = GPT2Config(vocab_size=200, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                        initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    return save_random(tmp_path_factory.mktemp("tiny_gpt2_embeds"), config)


def _reference(model_dir, embeds: torch.Tensor) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(inputs_embeds=embeds[None],
                         attention_mask=torch.ones(1, embeds.shape[0], dtype=torch.long),
                         max_new_tokens=8, do_sample=False, pad_token_id=0)
    return out[0].tolist()  # with inputs_embeds, generate returns the new tokens only


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_equal_transformers_batched_and_chunked(arch, tiny_llama_dir, tiny_gpt2_dir):
    model_dir = tiny_llama_dir if arch == "llama" else tiny_gpt2_dir
    llm = LLM(str(model_dir), dtype="float32", max_model_len=128, enable_prompt_embeds=True,
              max_num_batched_tokens=8, block_size=4, enable_prefix_caching=True)
    try:
        hidden = llm.llm_engine.engine_config.model_config.text_config.hidden_size
        generator = torch.Generator().manual_seed(0)
        first = torch.randn(11, hidden, generator=generator) * 0.5
        second = torch.randn(6, hidden, generator=generator) * 0.5
        prompts = [{"prompt_embeds": first}, {"prompt_token_ids": [5, 9, 11, 13]},
                   {"prompt_embeds": second}]
        outputs = llm.generate(prompts, PARAMS, use_tqdm=False)
        assert list(outputs[0].outputs[0].token_ids) == _reference(model_dir, first)
        assert list(outputs[2].outputs[0].token_ids) == _reference(model_dir, second)
        alone = llm.generate({"prompt_token_ids": [5, 9, 11, 13]}, PARAMS, use_tqdm=False)
        assert outputs[1].outputs[0].token_ids == alone[0].outputs[0].token_ids
        # The same embeddings again read 2 cached blocks; changed ones (even one value of
        # the last row) share none: a block's key carries the whole tensor's hash.
        again = llm.generate({"prompt_embeds": first.clone()}, PARAMS, use_tqdm=False)[0]
        assert again.num_cached_tokens == 8
        assert again.outputs[0].token_ids == outputs[0].outputs[0].token_ids
        changed = first.clone()
        changed[-1, 0] += 1.0
        other = llm.generate({"prompt_embeds": changed}, PARAMS, use_tqdm=False)[0]
        assert other.num_cached_tokens == 0
    finally:
        llm.llm_engine.shutdown()


def test_the_embeddings_of_tokens_give_those_tokens_output(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128,
              enable_prompt_embeds=True)
    try:
        ids = [5, 9, 11, 13, 17, 19]
        model = llm.llm_engine.engine_core.engine_core.executor.worker.model
        embeds = model.model.embed_tokens(torch.tensor(ids)).detach()
        from_ids, from_embeds = llm.generate(
            [{"prompt_token_ids": ids}, {"prompt_embeds": embeds}], PARAMS, use_tqdm=False)
        assert from_ids.outputs[0].token_ids == from_embeds.outputs[0].token_ids
    finally:
        llm.llm_engine.shutdown()


def test_bad_embeddings_are_value_errors(tiny_llama_dir):
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64)
    try:
        with pytest.raises(ValueError, match="enable_prompt_embeds"):
            plain.generate({"prompt_embeds": torch.zeros(3, 64)}, PARAMS, use_tqdm=False)
    finally:
        plain.llm_engine.shutdown()
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64, enable_prompt_embeds=True)
    try:
        hidden = llm.llm_engine.engine_config.model_config.text_config.hidden_size
        for bad, text in [(torch.zeros(3, hidden + 1), "shape"), (torch.zeros(0, hidden), "empty"),
                          (torch.zeros(64, hidden), "maximum context length"),
                          (torch.zeros(3, hidden, dtype=torch.int64), "float32"),
                          (torch.full((3, hidden), float("nan")), "NaN"),
                          ([[0.0] * hidden], "torch.Tensor")]:
            with pytest.raises(ValueError, match=text):
                llm.generate({"prompt_embeds": bad}, PARAMS, use_tqdm=False)
        with pytest.raises(ValueError, match="prompt_logprobs need prompt tokens"):
            llm.generate({"prompt_embeds": torch.zeros(3, hidden)},
                         SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)
        manager = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
        assert manager.get_num_free_blocks() == manager.num_usable_blocks  # nothing leaked
    finally:
        llm.llm_engine.shutdown()
