"""Llama-family causal LM: Llama 2/3, SmolLM2, TinyLlama, and Mistral (with its sliding
window, read from the config by DecoderSpec.from_hf).

Only the config → `DecoderSpec` mapping lives here; the layers are shared in `common.py`.
"""

from __future__ import annotations

from typing import Any

from pagedllm.models.common import DecoderForCausalLM, DecoderSpec


class LlamaForCausalLM(DecoderForCausalLM):
    """HF `LlamaForCausalLM` (and `MistralForCausalLM`) over the paged KV cache."""

    def __init__(self, hf_config: Any) -> None:
        attention_bias = bool(getattr(hf_config, "attention_bias", False))
        spec = DecoderSpec.from_hf(
            hf_config,
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
        )
        super().__init__(spec)
