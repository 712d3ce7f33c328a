"""Weight-only int8/int4 engines equal transformers running the same quantized weights.

The reference is transformers in float32 on a copy of the tiny checkpoint whose decoder
linear weights are replaced by what the engine's quantized weights stand for. The LM head
stays dense: the engine's int8 head only shortlists candidates, whose logits it then
recomputes with the dense weight. The engine runs float32 activations with quantized weights
only, so its greedy tokens must be the reference's, token for token.
"""

from __future__ import annotations

import random

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.layers.quantization import dequantize, quantize
from tests.conftest import hf_greedy_tokens

MAX_TOKENS = 16
BODY_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _fake_quantized_reference(model_dir, method: str, tmp_path):
    """transformers' model with every decoder linear replaced by its dequantized form."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.split(".")[-1] in BODY_LINEARS:
                weight = module.weight
                weight.copy_(dequantize(quantize(weight, method), weight.shape[1], torch.float32))
    return model


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_engine_matches_reference_on_same_weights(tiny_llama_dir, method, tmp_path):
    reference = _fake_quantized_reference(tiny_llama_dir, method, tmp_path)
    rng = random.Random(7)
    vocab = reference.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (4, 23, 50)]
    expected = hf_greedy_tokens(reference, prompts, MAX_TOKENS)

    llm = LLM(
        str(tiny_llama_dir), dtype="float32", max_model_len=128,
        quantization=method, keep_dense_weights=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_unknown_quantization_is_rejected(tiny_llama_dir):
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM(str(tiny_llama_dir), quantization="fp4")
