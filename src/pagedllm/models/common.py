"""The one decoder every architecture here is: built and run from a `DecoderSpec` (spec.py).

A model file states how its HF config maps onto a spec and, where its checkpoint names its
tensors differently, how those names map onto ours (`remap_weight`); this file builds the
layers the spec asks for, runs them, and loads HF-named checkpoints through the parameters'
`weight_loader` hooks. Attention metadata and the KV cache are never touched here: the
`Attention` layer gets them from the forward context. (The worker's decode-step fast paths,
worker/decode_step/, may run decode steps instead of this forward; they give its result.)

Our module names are HF's Llama names: model.embed_tokens, model.embed_positions (learned
positions), model.layers.N.{input_layernorm, self_attn.{qkv_proj, o_proj, q_norm, k_norm},
post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm, mlp.*},
model.norm, lm_head.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, cast

import torch
from torch import nn

from pagedllm.distributed.parallel_state import get_pp_group
from pagedllm.distributed.pipeline import IntermediateTensors, stage_layers
from pagedllm.layers.attention import Attention
from pagedllm.layers.embedding import GreedyTail, VocabEmbedding
from pagedllm.layers.layernorm import make_norm
from pagedllm.layers.linear import default_weight_loader
from pagedllm.layers.missing import MissingLayer
from pagedllm.layers.mlp import GatedMLP, PlainMLP
from pagedllm.layers.moe import FusedMoE
from pagedllm.layers.parallel_linear import (
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from pagedllm.layers.quantization import GroupCodes
from pagedllm.layers.rotary import MRotaryEmbedding, RotaryEmbedding
from pagedllm.models.interfaces import MultiModalEmbeddings
from pagedllm.models.spec import DecoderSpec, MoESpec, RopeSpec

__all__ = ["DecoderForCausalLM", "DecoderSpec", "MoESpec", "RopeSpec", "load_hf_tensor"]

Weight = torch.Tensor | GroupCodes


class DecoderAttention(nn.Module):
    """Fused QKV projection, optional per-head q/k norms, RoPE (unless positions are
    learned), paged attention (windowed on sliding layers), output projection."""

    def __init__(
        self, spec: DecoderSpec, rotary_emb: RotaryEmbedding | None, layer_idx: int
    ) -> None:
        super().__init__()
        # Split by heads over the tensor-parallel group (the plain layers for one rank).
        self.qkv_proj = QKVParallelLinear(
            spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.qkv_bias
        )
        self.o_proj = RowParallelLinear(
            spec.num_heads * spec.head_dim, spec.hidden_size, spec.o_bias
        )
        heads = self.qkv_proj.shard
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if spec.qk_norm:
            self.q_norm = make_norm(spec.norm, spec.head_dim, spec.norm_eps)
            self.k_norm = make_norm(spec.norm, spec.head_dim, spec.norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            len(heads.q_heads), spec.head_dim, spec.scale, len(heads.kv_heads), layer_idx,
            spec.layer_windows[layer_idx],
        )  # fmt: skip

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T] positions, [T, hidden] → [T, hidden]."""
        qk, v = self.qkv_proj.split_qk_v(self.qkv_proj(hidden_states))  # [T, (H+Hkv)*D]
        if self.q_norm is not None:
            qk = self._norm_heads(qk)
        num_heads = self.attn.num_heads
        if self.rotary_emb is None:  # learned positions: nothing to rotate
            q, k = qk.split([self.qkv_proj.q_size, self.qkv_proj.kv_size], dim=1)
        else:
            q, k = self.rotary_emb.forward_adjacent(positions, qk, num_heads)
        return self.o_proj(self.attn(q, k, v))  # attention out [T, H * D]

    def _norm_heads(self, qk: torch.Tensor) -> torch.Tensor:
        """q and k normalised per head over head_dim, side by side again [T, (H+Hkv)*D]."""
        assert self.q_norm is not None and self.k_norm is not None
        num_tokens, head_size = qk.shape[0], self.attn.head_size
        q_size = self.attn.num_heads * head_size
        q, k = qk[:, :q_size], qk[:, q_size:]
        q, _ = self.q_norm(q.reshape(-1, head_size).contiguous())
        k, _ = self.k_norm(k.reshape(-1, head_size).contiguous())
        return torch.cat([q.view(num_tokens, -1), k.view(num_tokens, -1)], dim=1)


def _make_mlp(spec: DecoderSpec, layer_idx: int) -> nn.Module:
    """The layer's feed-forward block: experts, gated or plain, as the spec says."""
    moe = spec.moe
    if moe is not None and spec.is_sparse(layer_idx):
        return FusedMoE(
            spec.hidden_size, moe.intermediate_size, moe.num_experts, moe.top_k,
            moe.renormalize, spec.activation, moe.shared_intermediate_size,
        )  # fmt: skip
    if spec.mlp == "plain":
        return PlainMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias, spec.activation)
    return GatedMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias, spec.activation)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)), with fused residual adds.

    With `sandwich_norms` (Gemma 3) the attention and MLP outputs are normalised too
    (post_attention_layernorm, post_feedforward_layernorm) and pre_feedforward_layernorm
    is the norm before the MLP; otherwise post_attention_layernorm is.
    """

    def __init__(
        self, spec: DecoderSpec, rotary_emb: RotaryEmbedding | None, layer_idx: int
    ) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(spec, rotary_emb, layer_idx)
        self.mlp = _make_mlp(spec, layer_idx)

        def norm() -> nn.Module:
            return make_norm(spec.norm, spec.hidden_size, spec.norm_eps, spec.norm_bias)

        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.sandwich = spec.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this block's MLP output, residual stream before adding it)."""
        # The residual add of the previous block happens inside this norm.
        hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        if self.sandwich:
            hidden_states, _ = self.post_attention_layernorm(hidden_states)
            hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
            hidden_states, _ = self.post_feedforward_layernorm(self.mlp(hidden_states))
            return hidden_states, residual
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


def rotary_embeddings(spec: DecoderSpec) -> list[RotaryEmbedding | None]:
    """Each layer's rotary embedding; layers that rotate alike share one (and its table)."""
    shared: dict[tuple[Any, ...], RotaryEmbedding] = {}
    result: list[RotaryEmbedding | None] = []
    for rope in spec.layer_ropes:
        if rope is None:
            result.append(None)
            continue
        if rope.key() not in shared and rope.mrope_section is not None:
            shared[rope.key()] = MRotaryEmbedding(
                spec.head_dim, spec.max_position, rope.theta, rope.mrope_section
            )
        elif rope.key() not in shared:
            shared[rope.key()] = RotaryEmbedding(
                spec.head_dim, spec.max_position, rope.theta, rope.scaling, rope.rotary_dim
            )
        result.append(shared[rope.key()])
    return result


class DecoderModel(nn.Module):
    """Embeddings, the decoder layers and the final norm (HF's `model.` prefix).

    Under pipeline parallelism a stage builds only its own layers (`stage_layers`; the others
    are `MissingLayer`s, their checkpoint tensors skipped): the first stage embeds, a later one
    starts from the previous stage's `IntermediateTensors`, and every stage but the last
    returns its residual stream instead of normed hidden states.
    """

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        self.stage_layers = stage_layers(spec.num_layers, pp.world_size, pp.rank_in_group)
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size)
        # As Gemma: the scale is rounded to the model dtype (a buffer follows .to()).
        scale = None
        if spec.embedding_scale is not None:
            scale = torch.tensor(spec.embedding_scale, dtype=torch.float32)
            scale = scale.to(torch.get_default_dtype())
        self.embed_scale: torch.Tensor | None
        self.register_buffer("embed_scale", scale, persistent=False)
        self.embed_positions: VocabEmbedding | None = None
        if spec.learned_positions:
            self.embed_positions = VocabEmbedding(
                spec.max_position + spec.position_offset, spec.hidden_size
            )
        ropes = rotary_embeddings(spec)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, ropes[i], i) if i in self.stage_layers else MissingLayer()
            for i in range(spec.num_layers)
        )
        self.norm = make_norm(spec.norm, spec.hidden_size, spec.norm_eps, spec.norm_bias)
        # An EAGLE-3 head reads the residual stream before these layers (len(layers): after
        # the last one), side by side, from every forward pass (spec_decode/eagle.py).
        self.aux_hidden_state_layers: tuple[int, ...] = ()
        self.aux_hidden_states: torch.Tensor | None = None

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor,
              replace: MultiModalEmbeddings | None = None) -> torch.Tensor:
        """[T] ids and positions → [T, hidden] input embeddings (scaled, plus positions).
        `replace`: rows given instead of their tokens' (an image's encoder output, a
        prompt's own embeddings), put after the scaling and before the positions, as
        transformers' `inputs_embeds`."""
        hidden_states = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            hidden_states = hidden_states * self.embed_scale
        if replace is not None:
            hidden_states = hidden_states.index_copy(
                0, replace.rows, replace.values.to(hidden_states.dtype))
        if self.embed_positions is not None:
            hidden_states = hidden_states + self.embed_positions(
                positions + self.spec.position_offset
            )
        return hidden_states

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """[T] ids and positions → [T, hidden] final hidden states (on a pipeline stage
        before the last: its residual stream, from the previous stage's on a later one).
        `inputs_embeds` [T, hidden], when given, replaces the embedding of the ids (a
        multimodal model's text and image embeddings, merged)."""
        residual: torch.Tensor | None = None
        if inputs_embeds is not None:
            hidden_states = inputs_embeds
        elif intermediate_tensors is None:
            hidden_states = self.embed(input_ids, positions)  # [T, hidden]
        else:
            hidden_states = intermediate_tensors.hidden_states
            residual = intermediate_tensors.residual
        if self.aux_hidden_state_layers:
            return self._forward_with_aux(positions, hidden_states)
        for index in self.stage_layers:
            hidden_states, residual = self.layers[index](positions, hidden_states, residual)
        if not self.is_last_stage:
            assert residual is not None
            return IntermediateTensors(hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def _forward_with_aux(
        self, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        """The layer loop, keeping the residual stream before the aux layers."""
        residual: torch.Tensor | None = None
        streams: dict[int, torch.Tensor] = {}
        for index in range(len(self.layers) + 1):
            if index in self.aux_hidden_state_layers:
                # A copy: fused norms update the residual stream in place.
                streams[index] = (
                    hidden_states.clone() if residual is None else hidden_states + residual
                )
            if index < len(self.layers):
                hidden_states, residual = self.layers[index](positions, hidden_states, residual)
        self.aux_hidden_states = torch.cat(
            [streams[i] for i in self.aux_hidden_state_layers], dim=-1
        )  # [T, n * hidden]
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class DecoderForCausalLM(nn.Module):
    """A `DecoderModel` plus the LM head, with HF-named weight loading (the CausalLM protocol).

    Subclasses build the spec from the config and override `remap_weight` when their
    checkpoints name (or lay out) tensors differently from HF Llama; `packed_modules_mapping`
    maps separate q/k/v and gate/up tensors onto the fused parameters.
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
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, tie_to=tie_to)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        mm_embeds: MultiModalEmbeddings | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """[T] int64 ids and positions → [T, hidden] hidden states (a pipeline stage before
        the last: its IntermediateTensors). `mm_embeds`: rows given in place of their
        tokens' embeddings (images' encoder outputs, prompt embeddings)."""
        if mm_embeds is None or intermediate_tensors is not None:
            return self.model(input_ids, positions, intermediate_tensors)
        embeds = self.model.embed(input_ids, positions, mm_embeds)  # [T, hidden]
        return self.model(input_ids, positions, None, inputs_embeds=embeds)

    def compute_logits(
        self, hidden_states: torch.Tensor, ranking_only: bool = False
    ) -> torch.Tensor:
        """[N, hidden] → [N, vocab] logits; pass only the positions to sample. With
        `ranking_only` (argmax only) the LM head may shortlist (see LMHead.forward)."""
        logits = self.lm_head(hidden_states, ranking_only)
        cap = self.spec.final_logit_softcap
        if cap is not None:  # monotonic: rankings are unchanged
            logits = torch.tanh(logits / cap) * cap
        return logits

    def compute_greedy_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden] → [N] argmax tokens, -1 for a row holding a NaN or infinity (the
        soft-cap is monotonic: it cannot change them, so it is skipped)."""
        return self.lm_head.greedy_tokens(hidden_states)

    def greedy_tail(self, hidden_states: torch.Tensor) -> GreedyTail | None:
        """The LM head's C greedy tail for rows like `hidden_states` (or None)."""
        return self.lm_head.greedy_tail(hidden_states)

    def remap_weight(self, hf_name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """The (name in Llama's HF naming, tensor) pairs a checkpoint tensor becomes; none
        to skip it. The default keeps it as it is."""
        yield hf_name, tensor

    def _is_skipped(self, hf_name: str) -> bool:
        # Rotary tables are rebuilt from the config; a tied head is the embedding itself.
        if "rotary_emb.inv_freq" in hf_name:
            return True
        if hf_name.startswith("model.layers."):
            parts = hf_name.split(".", 6)
            layer_index = int(parts[2])
            if layer_index not in self.model.stage_layers:
                return True  # another pipeline stage's layer
            if parts[3:5] == ["mlp", "experts"]:  # another expert-parallel rank's expert?
                mlp = cast(FusedMoE, self.model.layers[layer_index].mlp)
                return not mlp.holds_expert(int(parts[5]))
        return self.spec.tie_word_embeddings and hf_name.startswith("lm_head.")

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> set[str]:
        """Load HF-named tensors; return the names of the parameters that were filled."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for checkpoint_name, checkpoint_tensor in weights:
            for hf_name, tensor in self.remap_weight(checkpoint_name, checkpoint_tensor):
                if not self._is_skipped(hf_name):
                    loaded.add(self._load_one(params, hf_name, tensor))
        return loaded

    def _load_one(self, params: dict[str, nn.Parameter], hf_name: str, tensor: Weight) -> str:
        """Load one tensor into its (possibly fused) parameter; return the parameter name."""
        return load_hf_tensor(params, hf_name, tensor, self.packed_modules_mapping)


def load_hf_tensor(
    params: dict[str, nn.Parameter],
    hf_name: str,
    tensor: Weight,
    packed_modules_mapping: dict[str, tuple[str, str | int]],
) -> str:
    """Load one HF-named tensor into its parameter, separate q/k/v and gate/up tensors into
    their fused parameters (`packed_modules_mapping`); return the parameter's name.

    Raises:
        ValueError: when no parameter matches.
    """
    for hf_part, (fused_part, shard_id) in packed_modules_mapping.items():
        if f".{hf_part}." in hf_name:
            name = hf_name.replace(f".{hf_part}.", f".{fused_part}.")
            param = _param(params, name, hf_name)
            param.weight_loader(param, tensor, shard_id)  # type: ignore[attr-defined]
            return name
    param = _param(params, hf_name, hf_name)
    getattr(param, "weight_loader", default_weight_loader)(param, tensor)
    return hf_name


def _param(params: dict[str, nn.Parameter], name: str, hf_name: str) -> nn.Parameter:
    if name not in params:
        raise ValueError(f"Checkpoint tensor {hf_name!r} has no matching parameter {name!r}.")
    return params[name]
