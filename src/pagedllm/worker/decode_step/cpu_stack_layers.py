"""Which decoder layers the C decode stack runs, and their tables of pointers for it.

csrc/decode_stack.c runs models/common.py's DecoderLayer with its variants: q/k/v and
output biases (Qwen2), per-head q/k RMSNorm (Qwen3, Gemma 3), (1 + w) norms (Gemma: the
loader already stored 1 + w), sandwich norms (Gemma 3), LayerNorm with biases and a plain
GELU (tanh) or ReLU MLP (GPT-2, OPT; their learned positions are added by the embedding),
a SiLU- or GELU (tanh)-gated MLP, a RoPE table per layer (Gemma 3's local and global
bases) over all or part of each head, sliding windows, and each layer's KV cache group.
Every matrix must be one our kernels multiply (W4A8, W8A8, two of them summed: a split GGUF
format, or dense bf16 panels: Bf16PanelWeight) for the stack to take the step. MoE layers
(Mixtral, Qwen2-MoE, Qwen3-MoE) run csrc/moe.c, which their Python layer also calls for such
steps. Not in C (those models run the Python layers): M-RoPE (Qwen2-VL), weights in other
formats (torch's dense matmul, weight-only int8, act-order GPTQ...), LoRA on a MoE model.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from pagedllm.kernels.abi import StackLayer
from pagedllm.layers import cpu_ops
from pagedllm.layers.cpu_tables import (
    MoETable,
    gated_activation_code,
    stack_limit,
    stack_matrix,
)
from pagedllm.layers.layernorm import LayerNorm, OnePlusRMSNorm, RMSNorm
from pagedllm.layers.linear import Linear
from pagedllm.layers.mlp import GatedMLP, PlainMLP
from pagedllm.layers.moe import MOE_KERNEL_MAX_ROWS, FusedMoE
from pagedllm.layers.parallel_linear import VocabParallelEmbedding
from pagedllm.layers.rotary import RotaryEmbedding
from pagedllm.models.common import DecoderAttention, DecoderLayer, DecoderModel


def matrices(layer: DecoderLayer) -> tuple[Linear, ...]:
    """A stack layer's qkv and o projections, then its dense MLP's gate_up (a plain MLP's
    fc1) and down (fc2); a MoE layer's experts are in its table instead (moe_of)."""
    attn, mlp = layer.self_attn, layer.mlp
    if isinstance(mlp, PlainMLP):
        return attn.qkv_proj, attn.o_proj, mlp.fc1, mlp.fc2
    if isinstance(mlp, GatedMLP):
        return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
    return attn.qkv_proj, attn.o_proj


def moe_of(layer: DecoderLayer) -> MoETable | None:
    """A MoE layer's csrc/moe.c table (None: a dense MLP, or experts C cannot run)."""
    mlp = layer.mlp
    return mlp.kernel_table() if isinstance(mlp, FusedMoE) else None


def block_norms(layer: DecoderLayer) -> list[nn.Module]:
    """The norms on the residual stream: RMSNorm or LayerNorm, as the model's."""
    found = [layer.input_layernorm, layer.post_attention_layernorm]
    if layer.sandwich:
        found += [layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm]
    return found


def head_norms(layer: DecoderLayer) -> list[nn.Module]:
    """The per-head q/k RMSNorms, if the layer has them."""
    attn = layer.self_attn
    return [] if attn.q_norm is None else [attn.q_norm, cast(nn.Module, attn.k_norm)]


def activation_of(layer: DecoderLayer) -> int | None:
    """The MLP's activation as StackDims takes it, or None when the C loop has none."""
    mlp = layer.mlp
    if type(mlp) is PlainMLP:
        return cpu_ops.PLAIN_ACTIVATIONS.get(mlp.activation)
    if type(mlp) is GatedMLP:
        return gated_activation_code(mlp)
    table = moe_of(layer)
    return None if table is None else table.activation


def is_layer_norm(layer: DecoderLayer) -> bool:
    """Whether the layer's norms are LayerNorms (else RMSNorms)."""
    return type(layer.input_layernorm) is LayerNorm


def _norm_ok(norm: nn.Module, layer_norm: bool) -> bool:
    """A norm the C loop computes: all RMSNorm, or all LayerNorm (bias or none), bfloat16."""
    if layer_norm:
        bias = cast(LayerNorm, norm).bias
        return type(norm) is LayerNorm and (bias is None or bias.dtype == torch.bfloat16) and (
            cast(LayerNorm, norm).weight.dtype == torch.bfloat16
        )
    return type(norm) in (RMSNorm, OnePlusRMSNorm) and (
        cast(RMSNorm, norm).weight.dtype == torch.bfloat16
    )


def stack_layer(layer: nn.Module) -> bool:
    """True when csrc/decode_stack.c implements `layer` (see the module docstring); a layer
    without RoPE qualifies where its model adds learned positions (see `_qualifies`)."""
    if type(layer) is not DecoderLayer:
        return False
    attn, rotary = layer.self_attn, layer.self_attn.rotary_emb
    layer_norm = is_layer_norm(layer)
    return (
        type(attn) is DecoderAttention
        and type(layer.mlp) in (GatedMLP, PlainMLP, FusedMoE)
        and activation_of(layer) is not None
        and (rotary is None or _rotary_ok(rotary, attn.attn.head_size))
        and not (layer_norm and (layer.sandwich or attn.q_norm is not None))
        and all(_norm_ok(n, layer_norm) for n in block_norms(layer))
        and all(_norm_ok(n, False) for n in head_norms(layer))
        and all(stack_matrix(linear) is not None for linear in matrices(layer))
    )


def _rotary_ok(rotary: nn.Module, head_size: int) -> bool:
    return (
        type(rotary) is RotaryEmbedding
        and rotary.cos_sin_cache.dtype == torch.float32
        and rotary.head_size == head_size
    )


def shared_shape(layers: list[DecoderLayer]) -> bool:
    """Whether the layers share what StackDims holds once: heads, norm epsilon, softmax
    scale, activation, and the dense MLPs' kind and width (MoE layers hold their own)."""

    def shape(layer: DecoderLayer) -> tuple[object, ...]:
        attn = layer.self_attn.attn
        return (attn.num_heads, attn.num_kv_heads, attn.head_size, attn.scale,
                activation_of(layer), is_layer_norm(layer))

    dense = {(type(layer.mlp), matrices(layer)[3].input_size)
             for layer in layers if len(matrices(layer)) == 4}
    epsilons = {getattr(n, "eps", None) for layer in layers
                for n in (*block_norms(layer), *head_norms(layer))}
    return len({shape(layer) for layer in layers}) == 1 and len(epsilons) == 1 and (
        len(dense) <= 1
    )


def dense_mlp(layers: list[DecoderLayer]) -> tuple[int, bool]:
    """(intermediate size, gated) of the dense MLPs ((0, True) when every layer is MoE)."""
    for layer in layers:
        if len(matrices(layer)) == 4:
            return matrices(layer)[3].input_size, isinstance(layer.mlp, GatedMLP)
    return 0, True


def max_stack_tokens(
    layers: list[DecoderLayer], per_matrix: Callable[[Linear], int | None] = stack_limit
) -> int | None:
    """The largest step every matrix's table serves (None: any): where each is measured
    the faster method (cpu_tables.stack_limit), or with `per_matrix` =
    cpu_tables.stack_capacity where each can run at all. Sparse MLPs bound both alike."""
    limits = [
        limit
        for layer in layers
        for linear in matrices(layer)
        if (limit := per_matrix(linear)) is not None
    ]
    for layer in layers:
        table = moe_of(layer)
        if table is not None:  # the C kernel serves MoE steps up to a size
            limits.append(MOE_KERNEL_MAX_ROWS)
            if table.max_tokens is not None:
                limits.append(table.max_tokens)
    return min(limits) if limits else None


def plain_embedding(decoder: DecoderModel) -> tuple[torch.Tensor, float] | None:
    """The token embedding table [vocab, hidden] and its scale (0.0: none) when the
    model's embedding is a lookup the C loop can do (bfloat16, one rank, at most a
    bfloat16 scale as Gemma's, no learned positions)."""
    embed = decoder.embed_tokens
    weight = embed.weight
    if type(embed) is not VocabParallelEmbedding or embed.tp_group.world_size != 1:
        return None
    if decoder.embed_positions is not None:
        return None
    if not (weight.dtype == torch.bfloat16 and weight.is_cpu and weight.is_contiguous()):
        return None
    scale = decoder.embed_scale
    if scale is None:
        return weight, 0.0
    # A bfloat16 scale is exact as the C struct's float32 (torch's bfloat16 product of
    # two bfloat16 values, which the call rounds alike).
    if scale.dtype != torch.bfloat16 or scale.numel() != 1 or float(scale) == 0.0:
        return None
    return weight, float(scale)


def final_norm_pointers(norm: nn.Module | None, layer: DecoderLayer) -> tuple[int | None,
                                                                           int | None]:
    """The model's final norm as StackDims takes it (weight, bias), or (None, None) when the
    C loop cannot apply it (another kind or eps than the layers'): the caller then does."""
    layer_norm = is_layer_norm(layer)
    if norm is None or not _norm_ok(norm, layer_norm):
        return None, None
    if cast(RMSNorm, norm).eps != cast(RMSNorm, layer.input_layernorm).eps:
        return None, None
    return _pointer(norm), _bias_pointer(norm) if layer_norm else None


def _pointer(norm: nn.Module | None) -> int | None:
    return None if norm is None else cast(RMSNorm, norm).weight.data_ptr()


def _bias_pointer(norm: nn.Module) -> int | None:
    bias = cast(LayerNorm, norm).bias
    return None if bias is None else bias.data_ptr()


def fill_layer(entry: StackLayer, layer: DecoderLayer, kv_cache: torch.Tensor, group: int) -> None:
    """Write `layer`'s pointers and settings into its table entry."""
    attn = layer.self_attn
    entry.input_norm = _pointer(layer.input_layernorm)
    entry.post_attn_norm = _pointer(layer.post_attention_layernorm)
    if is_layer_norm(layer):
        entry.input_norm_bias = _bias_pointer(layer.input_layernorm)
        entry.post_attn_norm_bias = _bias_pointer(layer.post_attention_layernorm)
    if layer.sandwich:
        entry.pre_ffn_norm = _pointer(layer.pre_feedforward_layernorm)
        entry.post_ffn_norm = _pointer(layer.post_feedforward_layernorm)
    entry.q_norm, entry.k_norm = _pointer(attn.q_norm), _pointer(attn.k_norm)
    tables = [stack_matrix(m) for m in matrices(layer)]
    entry.qkv, entry.o = tables[0], tables[1]
    if len(tables) == 4:
        entry.gate_up, entry.down = tables[2], tables[3]
    moe = moe_of(layer)
    if moe is not None:
        entry.moe = ctypes.addressof(moe.table)
    rotary = attn.rotary_emb
    if rotary is not None:  # else learned positions: nothing to rotate (cos_sin NULL)
        entry.cos_sin = rotary.cos_sin_cache.data_ptr()
        entry.rot_dim = rotary.cos_sin_cache.shape[1]
    entry.window = attn.attn.sliding_window or 0
    entry.group = group
    entry.kv_cache = kv_cache.data_ptr()
