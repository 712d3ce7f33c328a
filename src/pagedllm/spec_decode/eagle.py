"""EAGLE and EAGLE-3 heads: a one-layer drafter over the target's hidden states (Li et al.).

At position p the head reads the target's hidden state at p and the token at p + 1, and
predicts the token at p + 2; its guesses then feed back its own output as the next hidden
state. It keeps a paged KV cache of its one layer on the target's block ids
(spec_decode/draft_kv.py) and, unlike a draft model, runs over every token the target
computes, every step (hidden states exist only in their step): cheap, one layer.

- EAGLE: fc([embed(token); hidden]) → a Llama layer without its input norm → the target's
  LM head. Checkpoints: `fc.*`, `layers.0.*` (optionally under `model.`), a Llama config.
- EAGLE-3: fc(three of the target's residual streams, side by side) → a layer whose
  attention reads [norm(embed(token)); hidden_norm(hidden)] → norm → its own LM head over a
  smaller draft vocabulary, mapped to the target's by `d2t` (target id = i + d2t[i]).
  Checkpoints: `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`; the
  target layers read are `eagle_aux_hidden_state_layer_ids` from its config, else vLLM's
  default (2, L // 2, L - 3).

The embeddings are the target's unless the checkpoint brings its own. Drafts are the head's
argmax (verified by matching).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from pagedllm.layers.embedding import VocabEmbedding
from pagedllm.layers.forward_context import set_forward_context
from pagedllm.layers.layernorm import make_norm
from pagedllm.layers.linear import Linear
from pagedllm.layers.parallel_linear import QKVParallelLinear
from pagedllm.models.common import (
    DecoderAttention,
    DecoderForCausalLM,
    DecoderLayer,
    load_hf_tensor,
    rotary_embeddings,
)
from pagedllm.models.spec import DecoderSpec
from pagedllm.spec_decode.checkpoint import read_config, read_tensors
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.draft_kv import DraftBatch, allocate_kv_caches, capacity, forward_context
from pagedllm.spec_decode.proposers import DrafterContext, Proposal, ProposalInputs


class _NoInputNorm(nn.Module):
    """EAGLE's layer has no input norm: the residual add alone."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The residual stream is float32, as every norm's (layers/layernorm.py).
        total = x.float() if residual is None else residual + x
        return total.to(x.dtype), total


class Eagle3Layer(nn.Module):
    """EAGLE-3's layer: attention over [input_norm(embeds); hidden_norm(hidden)] (2 x hidden
    wide), then the usual post-attention norm and MLP."""

    def __init__(self, spec: DecoderSpec, rotary_emb: Any) -> None:
        super().__init__()
        base = DecoderLayer(spec, rotary_emb, 0)
        self.self_attn: DecoderAttention = base.self_attn
        self.self_attn.qkv_proj = QKVParallelLinear(
            2 * spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.qkv_bias
        )
        self.mlp = base.mlp
        self.input_layernorm = make_norm(spec.norm, spec.hidden_size, spec.norm_eps)
        self.hidden_norm = make_norm(spec.norm, spec.hidden_size, spec.norm_eps)
        self.post_attention_layernorm = base.post_attention_layernorm

    def forward(
        self, positions: torch.Tensor, embeds: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        """Returns the layer's output before the final norm, [T, hidden]."""
        residual = hidden_states.float()  # the norms keep the residual stream in float32
        embeds, _ = self.input_layernorm(embeds)
        normed, _ = self.hidden_norm(hidden_states)
        attn = self.self_attn(positions, torch.cat([embeds, normed], dim=-1))
        hidden_states, residual = self.post_attention_layernorm(attn, residual)
        return self.mlp(hidden_states) + residual


class EagleHead(nn.Module):
    """An EAGLE (`eagle3=False`) or EAGLE-3 head built from its Llama config."""

    packed_modules_mapping = DecoderForCausalLM.packed_modules_mapping

    def __init__(
        self, hf_config: Any, eagle3: bool, num_aux: int, draft_vocab_size: int, fc_bias: bool
    ) -> None:
        super().__init__()
        spec = DecoderSpec.from_hf(
            hf_config, qkv_bias=bool(getattr(hf_config, "attention_bias", False))
        )
        hidden = spec.hidden_size
        rotary = rotary_embeddings(spec)[0]
        self.eagle3 = eagle3
        self.embed_tokens: VocabEmbedding | None = None  # set when the checkpoint has one
        self.norm: nn.Module | None = None
        self.lm_head: Linear | None = None
        self.layer: nn.Module
        if eagle3:
            self.fc = Linear(num_aux * hidden, hidden, bias=fc_bias)
            self.layer = Eagle3Layer(spec, rotary)
            self.norm = make_norm(spec.norm, hidden, spec.norm_eps)
            self.lm_head = Linear(hidden, draft_vocab_size, bias=False)
            # Draft id i is target id i + d2t[i].
            self.draft_to_target = torch.zeros(draft_vocab_size, dtype=torch.int64)
        else:
            self.fc = Linear(2 * hidden, hidden, bias=fc_bias)
            layer = DecoderLayer(spec, rotary, 0)
            layer.input_layernorm = _NoInputNorm()
            self.layer = layer

    def forward(
        self, positions: torch.Tensor, embeds: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        """[T] positions, [T, hidden] token embeddings, [T, hidden] hidden states (the
        target's, already through `fc` for EAGLE-3, or the head's own) → [T, hidden]."""
        if self.eagle3:
            return self.layer(positions, embeds, hidden_states).to(embeds.dtype)
        hidden_states = self.fc(torch.cat([embeds, hidden_states], dim=-1))
        out, residual = self.layer(positions, hidden_states, None)
        return (out + residual).to(embeds.dtype)


def load_eagle_head(
    config: SpeculativeConfig, context: DrafterContext, num_target_layers: int
) -> tuple[EagleHead, tuple[int, ...]]:
    """The head of an EAGLE / EAGLE-3 checkpoint folder, and (EAGLE-3) the target layers
    whose residual streams it reads.

    Raises:
        ValueError: for tensors that do not fit the config, or aux layers out of range.
    """
    assert config.model is not None
    raw_config = read_config(config.model)
    tensors = read_tensors(config.model)
    eagle3 = config.method == "eagle3"
    hf_config = SimpleNamespace(**{"rms_norm_eps": 1e-6, "rope_theta": 10000.0, **raw_config})
    aux_layers: tuple[int, ...] = ()
    if eagle3:
        default = (2, num_target_layers // 2, num_target_layers - 3)
        aux_layers = tuple(raw_config.get("eagle_aux_hidden_state_layer_ids") or default)
        if any(not 0 <= i <= num_target_layers for i in aux_layers):
            raise ValueError(
                f"EAGLE-3 aux hidden state layers {aux_layers} are outside the target's "
                f"0..{num_target_layers} layers."
            )
    draft_vocab = int(raw_config.get("draft_vocab_size") or raw_config["vocab_size"])
    with torch.device(context.device):
        fc_bias = "fc.bias" in tensors or "model.fc.bias" in tensors
        head = EagleHead(hf_config, eagle3, len(aux_layers), draft_vocab, fc_bias)
    _load(head, tensors, context)
    return head.to(context.dtype).eval().requires_grad_(False), aux_layers


def _load(head: EagleHead, tensors: dict[str, torch.Tensor], context: DrafterContext) -> None:
    """Load the published names onto the head's parameters."""
    if "embed_tokens.weight" in tensors or "model.embed_tokens.weight" in tensors:
        weight = tensors.get("embed_tokens.weight", tensors.get("model.embed_tokens.weight"))
        assert weight is not None
        with torch.device(context.device):
            head.embed_tokens = VocabEmbedding(weight.shape[0], weight.shape[1])
    params = dict(head.named_parameters())
    loaded: set[str] = set()
    for name, tensor in tensors.items():
        name = name.removeprefix("model.")
        if name == "t2d" or "rotary_emb" in name or (name == "lm_head.weight" and not head.eagle3):
            continue  # EAGLE (1) uses the target's LM head
        if name == "d2t":
            head.draft_to_target.copy_(tensor.to(torch.int64))
            continue
        name = name.replace("midlayer.", "layer.").replace("layers.0.", "layer.")
        loaded.add(load_hf_tensor(params, name, tensor, head.packed_modules_mapping))
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"The EAGLE checkpoint leaves parameters unfilled: {missing}.")


class EagleProposer:
    """Runs an EAGLE / EAGLE-3 head over each step's tokens and proposes from it."""

    def __init__(self, config: SpeculativeConfig, context: DrafterContext) -> None:
        target = context.target
        decoder = getattr(target, "model", None)
        if not isinstance(target, DecoderForCausalLM) or decoder is None:
            raise ValueError("EAGLE heads need a decoder target model.")
        self.target = target
        self.context = context
        self.k = config.num_speculative_tokens
        self.head, aux_layers = load_eagle_head(config, context, len(decoder.layers))
        if self.head.fc.weight.shape[0] != target.spec.hidden_size:
            raise ValueError("The EAGLE head's hidden size is not the target model's.")
        decoder.aux_hidden_state_layers = aux_layers
        spec = target.spec
        self.kv_caches = allocate_kv_caches(context, 1, spec.num_kv_heads, spec.head_dim)

    def forget(self, request_ids: Sequence[str]) -> None:
        """Nothing is kept per request (its KV lives in the request's blocks)."""

    @torch.inference_mode()
    def propose(self, inputs: ProposalInputs) -> Proposal:
        """Extend the head's KV over the step's kept tokens, then guess k tokens."""
        rows = [
            r for r in range(len(inputs.request_ids))
            if inputs.num_kept[r] > 0 and not (inputs.is_pooling and inputs.is_pooling[r])
        ]  # fmt: skip
        if not rows:
            return Proposal([[] for _ in inputs.propose_rows], [None] * len(inputs.propose_rows))
        hidden_in = self._target_hidden(inputs)
        starts = [int(inputs.context_lens[r]) for r in rows]
        kept = [int(inputs.num_kept[r]) for r in rows]
        tokens = [
            list(inputs.token_ids[r][s + 1 : s + n + 1])
            for r, s, n in zip(rows, starts, kept, strict=True)
        ]
        index = np.concatenate([
            np.arange(inputs.query_start_loc[r], inputs.query_start_loc[r] + n)
            for r, n in zip(rows, kept, strict=True)
        ])  # fmt: skip
        tables = [inputs.block_tables[r] for r in rows]
        batch = DraftBatch.build(tokens, starts, tables)
        out = self._forward(batch, hidden_in[torch.from_numpy(index).to(hidden_in.device)])
        last = batch.last_token_indices
        position_of = {r: i for i, r in enumerate(rows)}
        proposing = [position_of[r] for r in inputs.propose_rows]
        drafts: list[list[int]] = [[] for _ in proposing]
        if not proposing:
            return Proposal([], [])
        hidden = out[torch.from_numpy(last[proposing]).to(out.device)]  # [R, hidden]
        positions = [starts[i] + kept[i] for i in proposing]  # the next guess's position
        active = list(range(len(proposing)))
        for step in range(self.k):
            chosen = self._greedy(hidden[active] if len(active) < len(proposing) else hidden)
            for i, token in zip(active, chosen, strict=True):
                drafts[i].append(token)
            block_size = self.context.block_size
            active = [
                i for i in active
                if step + 1 < self.k and positions[i] < capacity(tables[proposing[i]], block_size)
            ]  # fmt: skip
            if not active:
                break
            batch = DraftBatch.build(
                [[drafts[i][-1]] for i in active], [positions[i] for i in active],
                [tables[proposing[i]] for i in active],
            )
            step_out = self._forward(batch, hidden[active], own_hidden=True)
            hidden = hidden.clone()
            hidden[active] = step_out
            for i in active:
                positions[i] += 1
        return Proposal(drafts, [None] * len(drafts))

    def _target_hidden(self, inputs: ProposalInputs) -> torch.Tensor:
        """The target's states the head reads: the final hidden states, or (EAGLE-3) the
        aux residual streams through `fc`."""
        if not self.head.eagle3:
            return inputs.hidden_states
        aux = self.target.model.aux_hidden_states
        assert aux is not None, "the target kept no aux hidden states"
        return aux.to(self.context.dtype)  # the residual streams are float32

    def _forward(
        self, batch: DraftBatch, hidden: torch.Tensor, own_hidden: bool = False
    ) -> torch.Tensor:
        """The head over `batch` with `hidden` per token ([T, hidden] or, for EAGLE-3's
        first pass, [T, n * hidden] streams) → [T, hidden] its outputs."""
        device = self.context.device
        input_ids = torch.from_numpy(batch.input_ids).to(device)
        positions = torch.from_numpy(batch.positions).to(device)
        embed = self.head.embed_tokens or self.target.model.embed_tokens
        embeds = embed(input_ids)
        if self.head.eagle3 and not own_hidden:
            hidden = self.head.fc(hidden)
        with set_forward_context(forward_context(self.context, batch, self.kv_caches)):
            return self.head(positions, embeds, hidden)

    def _greedy(self, hidden: torch.Tensor) -> list[int]:
        """The head's argmax token (target ids) after each of `hidden`."""
        if not self.head.eagle3:
            # A row that went non-finite (-1) drafts token 0: verification decides.
            return self.target.compute_greedy_tokens(hidden).clamp_(min=0).tolist()
        assert self.head.norm is not None and self.head.lm_head is not None
        normed, _ = self.head.norm(hidden)
        draft_ids = self.head.lm_head(normed).argmax(dim=-1)  # [R] in the draft vocabulary
        offsets = self.head.draft_to_target.to(draft_ids.device)
        return (draft_ids + offsets[draft_ids]).tolist()
