"""Gemma 3 (text) causal LM: (1 + w) RMSNorms, including per-head q/k norms and the sandwich
norms around attention and MLP; GeGLU (tanh GELU) MLP; embeddings scaled by sqrt(hidden);
sliding-window layers interleaved with global ones, each kind with its own RoPE base; scores
scaled by query_pre_attn_scalar ** -0.5; optional final logit soft-capping."""

from __future__ import annotations

from typing import Any

from pagedllm.models.common import DecoderForCausalLM, DecoderSpec, RopeSpec
from pagedllm.models.spec import activation_of

_ROPE_KEYS = {"sliding_attention": "rope_local_base_freq", "full_attention": "rope_theta"}


def _layer_ropes(hf_config: Any) -> tuple[RopeSpec, ...]:
    """Each layer's RoPE, by its kind: transformers 5 keeps one parameter set per layer
    kind in `rope_parameters`; older configs a global theta/scaling and a local base."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    ropes = {}
    for kind, old_key in _ROPE_KEYS.items():
        entry = params.get(kind)
        if entry is None:  # transformers 4 spelling
            scaling = getattr(hf_config, "rope_scaling", None) if kind == "full_attention" else None
            entry = {"rope_theta": getattr(hf_config, old_key), **(scaling or {})}
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        scaling = None if rope_type in (None, "default") else dict(entry)
        ropes[kind] = RopeSpec(float(entry["rope_theta"]), scaling)
    return tuple(ropes[kind] for kind in hf_config.layer_types)


class Gemma3ForCausalLM(DecoderForCausalLM):
    """HF `Gemma3ForCausalLM` (the text model) over the paged KV cache."""

    def __init__(self, hf_config: Any) -> None:
        if getattr(hf_config, "attn_logit_softcapping", None) is not None:
            raise ValueError("Gemma attention logit soft-capping is not supported.")
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ValueError("Gemma 3 with bidirectional attention is not supported.")
        spec = DecoderSpec.from_hf(
            hf_config,
            layer_ropes=_layer_ropes(hf_config),
            activation=activation_of(getattr(hf_config, "hidden_activation", "gelu_pytorch_tanh")),
            norm="rms_one_plus",
            qk_norm=True,
            sandwich_norms=True,
            embedding_scale=hf_config.hidden_size**0.5,
            attention_scale=hf_config.query_pre_attn_scalar**-0.5,
            final_logit_softcap=getattr(hf_config, "final_logit_softcapping", None),
            qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
            o_bias=bool(getattr(hf_config, "attention_bias", False)),
        )
        super().__init__(spec)
