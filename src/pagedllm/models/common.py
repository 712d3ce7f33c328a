"""Building blocks shared by Llama-like decoder models (pre-norm, RoPE, gated MLP).

A model file only states how its HF config maps onto a `DecoderSpec` (biases, tying); this
file builds the decoder stack, runs it, and loads HF-named checkpoints through the
parameters' `weight_loader` hooks. Attention metadata and the KV cache are never touched
here: the `Attention` layer gets them from the forward context (as does the CPU decode
stack, which replaces the layer loop for decode-only steps: cpu_decode_stack.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pagedllm.layers.activation import SiluAndMul
from pagedllm.layers.attention import Attention
from pagedllm.layers.embedding import LMHead, VocabEmbedding
from pagedllm.layers.layernorm import RMSNorm
from pagedllm.layers.linear import Linear, MergedColumnLinear, QKVLinear, default_weight_loader
from pagedllm.layers.rotary import RotaryEmbedding, rope_config_of
from pagedllm.models.cpu_decode_stack import CpuDecodeStack


@dataclass(frozen=True)
class DecoderSpec:
    """Dimensions and options of a pre-norm RoPE decoder, resolved from an HF config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False

    @classmethod
    def from_hf(cls, hf_config: Any, **options: bool) -> DecoderSpec:
        """Read the common fields of a Llama-family config; `options` sets biases/tying."""
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        theta, scaling = rope_config_of(hf_config)
        options.setdefault(
            "tie_word_embeddings", bool(getattr(hf_config, "tie_word_embeddings", False))
        )
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
            max_position=int(getattr(hf_config, "max_position_embeddings", 4096)),
            rope_theta=theta,
            rope_scaling=scaling,
            **options,
        )


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnLinear(hidden_size, [intermediate_size] * 2, bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] → [T, hidden]."""
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # via [T, 2 * intermediate]


class RopeSelfAttention(nn.Module):
    """Fused QKV projection, RoPE on q/k, paged attention, output projection."""

    def __init__(self, spec: DecoderSpec, rotary_emb: RotaryEmbedding, layer_idx: int) -> None:
        super().__init__()
        self.qkv_proj = QKVLinear(
            spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.qkv_bias
        )
        self.o_proj = Linear(spec.num_heads * spec.head_dim, spec.hidden_size, spec.o_bias)
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            spec.num_heads, spec.head_dim, spec.head_dim**-0.5, spec.num_kv_heads, layer_idx
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T] positions, [T, hidden] → [T, hidden]."""
        qk, v = self.qkv_proj.split_qk_v(self.qkv_proj(hidden_states))  # [T, (H+Hkv)*D]
        q, k = self.rotary_emb.forward_adjacent(positions, qk, self.attn.num_heads)
        return self.o_proj(self.attn(q, k, v))  # attention out [T, H * D]


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)), with fused residual adds."""

    def __init__(self, spec: DecoderSpec, rotary_emb: RotaryEmbedding, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = RopeSelfAttention(spec, rotary_emb, layer_idx)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this block's MLP output, residual stream before adding it)."""
        # The residual add of the previous block happens inside this norm.
        hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class DecoderModel(nn.Module):
    """Embedding, the decoder layers and the final norm (HF's `model.` prefix)."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden_size)
        rotary_emb = RotaryEmbedding(
            spec.head_dim, spec.max_position, spec.rope_theta, spec.rope_scaling
        )
        self.layers = nn.ModuleList(
            DecoderLayer(spec, rotary_emb, i) for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.cpu_decode_stack: CpuDecodeStack | None = None

    def build_cpu_decode_stack(self) -> None:
        """After loading (and quantizing): run decode-only steps as one C call when this
        model qualifies (see cpu_decode_stack.py)."""
        self.cpu_decode_stack = CpuDecodeStack.build(self)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[T] ids and positions → [T, hidden] final hidden states."""
        hidden_states = self.embed_tokens(input_ids)  # [T, hidden]
        residual: torch.Tensor | None = None
        stack = self.cpu_decode_stack
        if stack is not None and stack.serves(hidden_states, positions):
            hidden_states, residual = stack(hidden_states, positions)
        else:
            for layer in self.layers:
                hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class DecoderForCausalLM(nn.Module):
    """A `DecoderModel` plus the LM head, with HF-named weight loading (the CausalLM protocol).

    Subclasses set `packed_modules_mapping` if their checkpoints differ; the default maps HF's
    separate q/k/v and gate/up projections onto the fused parameters.
    """

    packed_modules_mapping: dict[str, tuple[str, str | int]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.model = DecoderModel(spec)
        tie_to = self.model.embed_tokens if spec.tie_word_embeddings else None
        self.lm_head = LMHead(spec.vocab_size, spec.hidden_size, tie_to=tie_to)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[T] int64 ids and positions → [T, hidden] hidden states."""
        return self.model(input_ids, positions)

    def compute_logits(
        self, hidden_states: torch.Tensor, ranking_only: bool = False
    ) -> torch.Tensor:
        """[N, hidden] → [N, vocab] logits; pass only the positions to sample. With
        `ranking_only` (argmax only) the LM head may shortlist (see LMHead.forward)."""
        return self.lm_head(hidden_states, ranking_only)

    def _is_skipped(self, hf_name: str) -> bool:
        # Rotary tables are rebuilt from the config; a tied head is the embedding itself.
        if "rotary_emb.inv_freq" in hf_name:
            return True
        return self.spec.tie_word_embeddings and hf_name.startswith("lm_head.")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors; return the names of the parameters that were filled."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if self._is_skipped(hf_name):
                continue
            for hf_part, (fused_part, shard_id) in self.packed_modules_mapping.items():
                if f".{hf_part}." in hf_name:
                    name = hf_name.replace(f".{hf_part}.", f".{fused_part}.")
                    param = self._param(params, name, hf_name)
                    param.weight_loader(param, tensor, shard_id)  # type: ignore[attr-defined]
                    break
            else:
                name = hf_name
                param = self._param(params, name, hf_name)
                loader = getattr(param, "weight_loader", default_weight_loader)
                loader(param, tensor)
            loaded.add(name)
        return loaded

    @staticmethod
    def _param(params: dict[str, nn.Parameter], name: str, hf_name: str) -> nn.Parameter:
        if name not in params:
            raise ValueError(f"Checkpoint tensor {hf_name!r} has no matching parameter {name!r}.")
        return params[name]
