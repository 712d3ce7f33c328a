"""Qwen2 / Qwen2.5 causal LM: a Llama-like decoder with q/k/v biases and optional tying
(a sliding window, where the config turns it on, applies to the layers it names).

Only the config → `DecoderSpec` mapping lives here; the layers are shared in `common.py`.
"""

from __future__ import annotations

from typing import Any

from pagedllm.models.common import DecoderForCausalLM, DecoderSpec


class Qwen2ForCausalLM(DecoderForCausalLM):
    """HF `Qwen2ForCausalLM` over the paged KV cache."""

    def __init__(self, hf_config: Any) -> None:
        spec = DecoderSpec.from_hf(hf_config, qkv_bias=True, o_bias=False, mlp_bias=False)
        super().__init__(spec)
