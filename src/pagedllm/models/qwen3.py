"""Qwen3 causal LM: Qwen2's decoder without q/k/v biases, with per-head RMSNorms of q and k
before RoPE (`qk_norm`)."""

from __future__ import annotations

from typing import Any

from pagedllm.models.common import DecoderForCausalLM, DecoderSpec


class Qwen3ForCausalLM(DecoderForCausalLM):
    """HF `Qwen3ForCausalLM` over the paged KV cache."""

    def __init__(self, hf_config: Any) -> None:
        attention_bias = bool(getattr(hf_config, "attention_bias", False))
        spec = DecoderSpec.from_hf(
            hf_config, qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True
        )
        super().__init__(spec)
