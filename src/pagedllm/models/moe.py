"""Mixture-of-experts causal LMs: Mixtral, Qwen2-MoE (with its shared expert) and Qwen3-MoE
(with q/k norms). Attention is their dense family's; the MLP of the sparse layers is the
fused MoE layer (layers/moe.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pagedllm.models.common import DecoderForCausalLM, DecoderSpec, MoESpec, Weight

# Mixtral's expert names → the gated-MLP names our experts share with every other MLP.
_MIXTRAL_RENAMES = (
    (".block_sparse_moe.", ".mlp."),
    (".w1.", ".gate_proj."),
    (".w3.", ".up_proj."),
    (".w2.", ".down_proj."),
)


def _qwen_sparse_layers(hf_config: Any) -> frozenset[int]:
    """Qwen-MoE layers with experts: every decoder_sparse_step-th, minus mlp_only_layers."""
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
    return frozenset(
        i for i in range(hf_config.num_hidden_layers) if i not in dense and (i + 1) % step == 0
    )


class MixtralForCausalLM(DecoderForCausalLM):
    """HF `MixtralForCausalLM`: Mistral attention, every MLP a top-k mixture of experts."""

    def __init__(self, hf_config: Any) -> None:
        moe = MoESpec(
            num_experts=hf_config.num_local_experts,
            top_k=hf_config.num_experts_per_tok,
            intermediate_size=hf_config.intermediate_size,
            renormalize=True,
            sparse_layers=frozenset(range(hf_config.num_hidden_layers)),
        )
        super().__init__(DecoderSpec.from_hf(hf_config, moe=moe))

    def remap_weight(self, hf_name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """block_sparse_moe.experts.N.w1/w3/w2 → mlp.experts.N.gate/up/down_proj."""
        if ".block_sparse_moe." in hf_name:
            for old, new in _MIXTRAL_RENAMES:
                hf_name = hf_name.replace(old, new)
        yield hf_name, tensor


def _qwen_moe(hf_config: Any, renormalize_default: bool, shared: bool) -> MoESpec:
    """The experts of a Qwen-MoE config (Qwen2-MoE adds the shared expert)."""
    return MoESpec(
        num_experts=hf_config.num_experts,
        top_k=hf_config.num_experts_per_tok,
        intermediate_size=hf_config.moe_intermediate_size,
        renormalize=bool(getattr(hf_config, "norm_topk_prob", renormalize_default)),
        shared_intermediate_size=hf_config.shared_expert_intermediate_size if shared else 0,
        sparse_layers=_qwen_sparse_layers(hf_config),
    )


class Qwen2MoeForCausalLM(DecoderForCausalLM):
    """HF `Qwen2MoeForCausalLM`: Qwen2 attention; routed experts plus a gated shared one."""

    def __init__(self, hf_config: Any) -> None:
        moe = _qwen_moe(hf_config, renormalize_default=False, shared=True)
        bias = bool(getattr(hf_config, "qkv_bias", True))
        super().__init__(DecoderSpec.from_hf(hf_config, moe=moe, qkv_bias=bias))


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    """HF `Qwen3MoeForCausalLM`: Qwen3 attention (q/k norms), routed experts."""

    def __init__(self, hf_config: Any) -> None:
        moe = _qwen_moe(hf_config, renormalize_default=True, shared=False)
        bias = bool(getattr(hf_config, "attention_bias", False))
        spec = DecoderSpec.from_hf(hf_config, moe=moe, qkv_bias=bias, o_bias=bias, qk_norm=True)
        super().__init__(spec)
