"""Phi-3 causal LM: a Llama-like decoder whose checkpoints store q/k/v and gate/up already
fused (qkv_proj, gate_up_proj: loaded whole into our fused layers), with LongRoPE ("su" /
"longrope") scaling and, in some configs, a sliding window."""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedllm.models.common import DecoderForCausalLM, DecoderSpec, RopeSpec
from pagedllm.models.spec import activation_of, rope_spec_of


def _rope(hf_config: Any, head_dim: int) -> RopeSpec:
    """Phi-3's RoPE: LongRoPE's attention factor comes from max / original positions."""
    rope = rope_spec_of(hf_config, head_dim)
    original = getattr(hf_config, "original_max_position_embeddings", None)
    if rope.scaling is None or not original:
        return rope
    scaling = dict(rope.scaling)
    scaling.setdefault("original_max_position_embeddings", original)
    scaling["factor"] = hf_config.max_position_embeddings / original
    return dataclasses.replace(rope, scaling=scaling)


class Phi3ForCausalLM(DecoderForCausalLM):
    """HF `Phi3ForCausalLM` over the paged KV cache."""

    # The checkpoint's qkv_proj and gate_up_proj are our fused parameters as they are.
    packed_modules_mapping: dict[str, tuple[str, str | int]] = {}

    def __init__(self, hf_config: Any) -> None:
        head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads
        )
        rope = _rope(hf_config, head_dim)
        spec = DecoderSpec.from_hf(
            hf_config,
            layer_ropes=(rope,) * hf_config.num_hidden_layers,
            activation=activation_of(hf_config.hidden_act),
        )
        super().__init__(spec)
