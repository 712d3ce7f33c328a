"""GPT-2: pre-LayerNorm decoder with learned positions, biases everywhere, a plain tanh-GELU
MLP, and Conv1D checkpoints ([in, out] matrices, transposed here on load)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pagedllm.layers.quantization import GroupCodes
from pagedllm.models.common import DecoderForCausalLM, DecoderSpec, Weight
from pagedllm.models.spec import activation_of

# GPT-2 names (without the "transformer." prefix) → ours; True: a Conv1D weight to transpose.
_BLOCK = {
    "ln_1": ("input_layernorm", False),
    "attn.c_attn": ("self_attn.qkv_proj", True),
    "attn.c_proj": ("self_attn.o_proj", True),
    "ln_2": ("post_attention_layernorm", False),
    "mlp.c_fc": ("mlp.fc1", True),
    "mlp.c_proj": ("mlp.fc2", True),
}
_GLOBAL = {"wte": "model.embed_tokens", "wpe": "model.embed_positions", "ln_f": "model.norm"}
_BLOCK_RE = re.compile(r"^h\.(\d+)\.(.+)\.(weight|bias)$")


class GPT2LMHeadModel(DecoderForCausalLM):
    """HF `GPT2LMHeadModel` over the paged KV cache."""

    packed_modules_mapping: dict[str, tuple[str, str | int]] = {}

    def __init__(self, hf_config: Any) -> None:
        if getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
            raise ValueError("GPT-2 with scale_attn_by_inverse_layer_idx is not supported.")
        if not getattr(hf_config, "scale_attn_weights", True):
            raise ValueError("GPT-2 with scale_attn_weights=False is not supported.")
        hidden = hf_config.n_embd
        spec = DecoderSpec.learned_positions_layernorm(
            vocab_size=hf_config.vocab_size,
            hidden_size=hidden,
            intermediate_size=hf_config.n_inner or 4 * hidden,
            num_layers=hf_config.n_layer,
            num_heads=hf_config.n_head,
            norm_eps=hf_config.layer_norm_epsilon,
            max_position=hf_config.n_positions,
            bias=True,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
            activation=activation_of(hf_config.activation_function),
        )
        super().__init__(spec)

    def remap_weight(self, hf_name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """GPT-2 names → ours; Conv1D weights transposed to [out, in]. Names already ours
        (a GGUF file's, whose matrices are [out, in]) pass as they are."""
        name = hf_name.removeprefix("transformer.")
        if name.startswith(("lm_head.", "model.")):
            yield name, tensor
            return
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            return  # causal-mask buffers of old checkpoints
        if (match := _BLOCK_RE.match(name)) is not None:
            layer, part, kind = match.groups()
            ours, conv1d = _BLOCK[part]
            if conv1d and kind == "weight":
                if isinstance(tensor, GroupCodes):
                    raise ValueError("GPT-2 Conv1D weights are loaded from float tensors only.")
                tensor = tensor.t().contiguous()
            yield f"model.layers.{layer}.{ours}.{kind}", tensor
            return
        module, kind = name.rsplit(".", 1)
        if module not in _GLOBAL:
            raise ValueError(f"Unknown GPT-2 checkpoint tensor {hf_name!r}.")
        yield f"{_GLOBAL[module]}.{kind}", tensor
