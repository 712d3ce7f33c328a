"""OPT: pre-LayerNorm decoder with learned positions (the table starts at row 2), biases,
a plain ReLU MLP (fc1 / fc2) and a tied LM head."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pagedllm.models.common import DecoderForCausalLM, DecoderSpec, Weight
from pagedllm.models.spec import activation_of

# OPT module names → ours, applied to names with the "model.decoder." prefix removed.
_RENAMES = (
    ("self_attn.out_proj.", "self_attn.o_proj."),
    ("self_attn_layer_norm.", "input_layernorm."),
    ("final_layer_norm.", "post_attention_layernorm."),
    ("fc1.", "mlp.fc1."),
    ("fc2.", "mlp.fc2."),
)
# OPTLearnedPositionalEmbedding: position p reads row p + 2.
_POSITION_OFFSET = 2


class OPTForCausalLM(DecoderForCausalLM):
    """HF `OPTForCausalLM` over the paged KV cache."""

    def __init__(self, hf_config: Any) -> None:
        if not getattr(hf_config, "do_layer_norm_before", True):
            raise ValueError("OPT with do_layer_norm_before=False (opt-350m) is not supported.")
        if hf_config.word_embed_proj_dim != hf_config.hidden_size:
            raise ValueError("OPT with word_embed_proj_dim != hidden_size is not supported.")
        if not getattr(hf_config, "layer_norm_elementwise_affine", True):
            raise ValueError("OPT without affine LayerNorms is not supported.")
        spec = DecoderSpec.learned_positions_layernorm(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.ffn_dim,
            num_layers=hf_config.num_hidden_layers,
            num_heads=hf_config.num_attention_heads,
            norm_eps=1e-5,  # torch.nn.LayerNorm's default, which OPT uses
            max_position=hf_config.max_position_embeddings,
            bias=bool(getattr(hf_config, "enable_bias", True)),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
            activation=activation_of(hf_config.activation_function),
            position_offset=_POSITION_OFFSET,
        )
        super().__init__(spec)

    def remap_weight(self, hf_name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """OPT names → ours (the decoder's final_layer_norm is the model's final norm)."""
        if hf_name.startswith("lm_head."):
            yield hf_name, tensor
            return
        name = hf_name.removeprefix("model.").removeprefix("decoder.")
        if name.startswith("final_layer_norm."):
            yield "model.norm." + name.removeprefix("final_layer_norm."), tensor
            return
        if name.startswith("layers."):
            for old, new in _RENAMES:
                name = name.replace(f".{old}", f".{new}")
        yield "model." + name, tensor
