"""The whole decoder stack in one C call for decode steps on CPU (csrc/decode_stack.c).

A decode step of one token through a 30-layer model is about 400 small ops. Each costs a
few microseconds of Python and torch dispatch, more than the work of most of them: a
single stream spends most of its step there. For bfloat16 Llama-style models whose matrices
are W4A8 weights (int4 quantization, the CPU default), steps made only of decodes (one
token per row, any number of rows) run the embedding lookup, every layer in one C loop
over the same kernels the Python layers call, in the same order, and the final norm: the
result is bit-identical to the model's forward (tested), only the dispatch is gone. Where
the layers keep dense weights for large steps (CPUs with matrix units,
layers/quantization/crossover.py), the stack takes only the steps small enough for W4A8.

LoRA steps run here too: after each matrix the C loop adds the tokens' adapter deltas
with the kernel the layers' LoRA slots call (csrc/lora.c), unless that step's deltas go to
torch instead (lora/cpu_kernel.py). Anything else (prefills, mixed steps, float32, other
layer types) runs the Python layers. PAGEDLLM_DECODE_STACK=python switches the stack off.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from pagedllm.kernels import pointer
from pagedllm.kernels.abi import StackDims, StackLayer, StackLoRA, StackLoRAStep
from pagedllm.layers.activation import SiluAndMul
from pagedllm.layers.layernorm import RMSNorm
from pagedllm.layers.linear import Linear
from pagedllm.layers.mlp import GatedMLP
from pagedllm.layers.quantization import CrossoverMethod, W4A8Weight
from pagedllm.layers.rotary import RotaryEmbedding
from pagedllm.lora.layers import LoRALinearMethod, LoRALinearSlots
from pagedllm.models.common import DecoderAttention, DecoderLayer, DecoderModel
from pagedllm.platform import cpu_platform
from pagedllm.worker.decode_step.base import DecodeBatch, DecodeStep


def _library() -> Any:
    """The kernel library's handle, or None when the stack's parts are off here (they must
    run here as they do in the Python layers for the results to agree)."""
    platform = cpu_platform()
    if not (platform.fused_ops() and platform.attention_kernels(torch.bfloat16)):
        return None
    library = platform.kernel_library()
    return None if library is None else library.lib


def _w4a8_and_limit(linear: Linear) -> tuple[W4A8Weight, int | None] | None:
    """The layer's W4A8 weight and the largest step it serves (None: every step; a
    crossover sends larger ones to the dense weight), or None when it runs no W4A8."""
    if linear.bias is not None:
        return None
    method = linear.method.base_method()
    if isinstance(method, W4A8Weight):
        return method, None
    if isinstance(method, CrossoverMethod) and isinstance(method.small, W4A8Weight):
        return method.small, method.max_tokens
    return None


def _w4a8(linear: Linear) -> W4A8Weight:
    found = _w4a8_and_limit(linear)
    assert found is not None, "a standard layer runs W4A8"
    return found[0]


def _max_quantized_tokens(layers: list[DecoderLayer]) -> int | None:
    """The largest step every layer runs on W4A8 (None: any)."""
    limits = [
        found[1]
        for layer in layers
        for linear in _matrices(layer)
        if (found := _w4a8_and_limit(linear)) is not None and found[1] is not None
    ]
    return min(limits) if limits else None


def _matrices(layer: DecoderLayer) -> tuple[Linear, Linear, Linear, Linear]:
    """A standard layer's qkv, o, gate_up and down projections."""
    mlp = cast(GatedMLP, layer.mlp)
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _rotary(layer: DecoderLayer) -> RotaryEmbedding:
    """A standard layer's rotary embedding (it has one: see standard_layer)."""
    rotary = layer.self_attn.rotary_emb
    assert rotary is not None
    return rotary


def standard_layer(layer: nn.Module) -> bool:
    """True when `layer` is exactly the Llama block the C loop implements: RMSNorm before
    attention and MLP (no sandwich norms, no q/k norms), neox RoPE over whole heads, full
    attention (no window), a SiLU-gated MLP (no experts), W4A8 matrices without biases.
    Llama, Mistral without a window and Phi-3 qualify. Other layers (Qwen2's q/k/v biases,
    Gemma 3, Qwen3, GPT-2, OPT, MoE, sliding windows) run the Python layers:
    csrc/decode_stack.c would need their parts first (tests/models/test_model_parity.py
    pins which architectures it serves)."""
    if type(layer) is not DecoderLayer or layer.sandwich:
        return False
    attn, mlp = layer.self_attn, layer.mlp
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    return (
        type(attn) is DecoderAttention
        and attn.q_norm is None
        and attn.attn.sliding_window is None
        and type(mlp) is GatedMLP
        and type(mlp.act_fn) is SiluAndMul
        and type(attn.rotary_emb) is RotaryEmbedding
        and attn.rotary_emb.rotary_dim == attn.rotary_emb.head_size
        and all(type(n) is RMSNorm and n.weight.dtype == torch.bfloat16 for n in norms)
        and all(_w4a8_and_limit(linear) is not None for linear in _matrices(layer))
    )


def _decoder(model: nn.Module) -> DecoderModel | None:
    """The causal LM's DecoderModel (its `model`), or None for other models."""
    decoder = getattr(model, "model", None)
    return decoder if isinstance(decoder, DecoderModel) else None


def serves_model(model: nn.Module) -> bool:
    """Whether the stack can run `model`'s decode steps (given int8 or bfloat16 caches and
    the C library): a causal LM over a DecoderModel whose layers all qualify."""
    decoder = _decoder(model)
    return decoder is not None and _qualifies(decoder)


def _qualifies(decoder: DecoderModel) -> bool:
    """Every layer standard, one rotary table (float32, whole heads) for all of them."""
    layers = cast("list[DecoderLayer]", list(decoder.layers))
    if not layers or not all(standard_layer(layer) for layer in layers):
        return False
    rotary = _rotary(layers[0])
    return (
        all(layer.self_attn.rotary_emb is rotary for layer in layers)
        and rotary.cos_sin_cache.dtype == torch.float32
        and rotary.head_size == layers[0].self_attn.attn.head_size
        and decoder.embed_positions is None
    )


class CpuDecodeStack(DecodeStep):
    """Runs a decoder model's decode-only steps in one C call (see the module docstring).

    Build it with `CpuDecodeStack.build`, which returns None when the model or the cache
    does not qualify. It holds no weights of its own: only pointers into the model's tensors
    and its KV caches, written once.
    """

    def __init__(self, decoder: DecoderModel, kv_caches: list[torch.Tensor], library: Any) -> None:
        self.decoder = decoder
        self.library = library
        self.layers = cast("list[DecoderLayer]", list(decoder.layers))
        first = self.layers[0]
        attn = first.self_attn.attn
        self.rotary = _rotary(first)
        _, num_blocks, block_size, _, _ = kv_caches[0].shape
        self.dims = StackDims(
            num_layers=len(self.layers),
            hidden=first.input_layernorm.hidden_size,
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads,
            head_size=attn.head_size,
            intermediate=_matrices(first)[3].input_size,
            rot_dim=self.rotary.cos_sin_cache.shape[1],
            num_blocks=num_blocks,
            block_size=block_size,
            kv_bf16=int(kv_caches[0].dtype == torch.bfloat16),
            eps=first.input_layernorm.eps,
            scale=attn.scale,
        )
        self.table = self._layer_table(kv_caches)
        self.lora_slots = self._lora_slots()
        self.lora_table = self._lora_table() if self.lora_slots is not None else None
        self.max_tokens = _max_quantized_tokens(self.layers)

    @classmethod
    def build(cls, model: nn.Module, kv_caches: list[torch.Tensor]) -> CpuDecodeStack | None:
        """The stack for `model` (a causal LM over a DecoderModel), or None: it needs
        bfloat16 Llama-style layers with W4A8 matrices, int8 or bfloat16 KV caches of every
        layer, and the C library's fused ops and attention kernels."""
        decoder = _decoder(model)
        if decoder is None or not _qualifies(decoder):
            return None
        if len(kv_caches) != len(decoder.layers) or kv_caches[0].dtype not in (
            torch.int8, torch.bfloat16
        ):
            return None
        library = _library()
        return None if library is None else cls(decoder, kv_caches, library)

    def serves(self, batch: DecodeBatch) -> bool:
        """Steps the W4A8 weights serve (not those sent to kept dense weights), whose LoRA
        deltas the C kernel takes, on a model that keeps no aux hidden states (EAGLE-3)."""
        num_rows = batch.num_rows
        if num_rows == 0 or self.decoder.aux_hidden_state_layers:
            return False
        if self.max_tokens is not None and num_rows > self.max_tokens:
            return False  # the layers' dense weights are faster for this step
        slots = self.lora_slots
        return slots is None or not slots.batch.active or slots.kernel_serves(num_rows)

    def run(self, batch: DecodeBatch) -> torch.Tensor:
        """Embeddings, every layer in C, the final norm: [n, hidden] as the model's
        forward would return them."""
        input_ids = torch.from_numpy(batch.input_ids)
        positions = torch.from_numpy(batch.positions)
        hidden = self.decoder.embed(input_ids, positions).contiguous()  # [T, hidden], fresh
        num_tokens = hidden.shape[0]
        residual = torch.empty(num_tokens, hidden.shape[1], dtype=torch.float32)
        # int32 rows, contiguous, kept alive here for the C call (which reads them).
        block_tables = torch.from_numpy(np.ascontiguousarray(batch.block_table, np.int32))
        seq_lens = torch.from_numpy((batch.positions + 1).astype(np.int32))
        token_rows = torch.arange(num_tokens, dtype=torch.int32)
        slots = torch.from_numpy(batch.slot_mapping.astype(np.int64, copy=False))
        self.dims.max_blocks = block_tables.shape[1]  # changes from step to step
        lora_step = self._lora_step()
        failed = self.library.decode_stack_bf16(
            ctypes.byref(self.dims), self.table, num_tokens, pointer(hidden), pointer(residual),
            pointer(positions), pointer(self.rotary.cos_sin_cache), pointer(slots),
            pointer(block_tables), pointer(seq_lens), pointer(token_rows),
            int(batch.positions.max()) + 1,
            None if lora_step is None else ctypes.byref(lora_step),
        )
        if failed:
            raise RuntimeError(f"The CPU decode stack failed (code {failed}).")
        hidden, _ = self.decoder.norm(hidden, residual)
        return hidden

    def _layer_table(self, kv_caches: list[torch.Tensor]) -> ctypes.Array[StackLayer]:
        """Every layer's norm weights, W4A8 matrices and KV cache, as pointers."""
        table = (StackLayer * len(self.layers))()
        for entry, layer, kv_cache in zip(table, self.layers, kv_caches, strict=True):
            weights = [_w4a8(linear) for linear in _matrices(layer)]
            norms = cast("tuple[RMSNorm, RMSNorm]", (layer.input_layernorm,
                                                     layer.post_attention_layernorm))
            entry.input_norm, entry.post_norm = (norm.weight.data_ptr() for norm in norms)
            entry.qkv, entry.o, entry.gate_up, entry.down = (
                w.packed.data_ptr() for w in weights
            )
            entry.qkv_dm, entry.o_dm, entry.gate_up_dm, entry.down_dm = (
                w.scales_and_mins.data_ptr() for w in weights
            )
            entry.kv_cache = kv_cache.data_ptr()
        return table

    # LoRA: the layers' adapter slots (lora/layers.py) feed the same C kernel the Python
    # layers call, after each matrix.

    def _lora_slots(self) -> LoRALinearSlots | None:
        """The first matrix's LoRA slots (every matrix has them when LoRA is on), or None."""
        method = _matrices(self.layers[0])[0].method
        return method.slots if isinstance(method, LoRALinearMethod) else None

    def _lora_table(self) -> ctypes.Array[StackLoRA]:
        """Pointers to every matrix's slot weights (written in place as adapters change)."""
        table = (StackLoRA * (4 * len(self.layers)))()
        for index, linear in enumerate(m for layer in self.layers for m in _matrices(layer)):
            method = linear.method
            assert isinstance(method, LoRALinearMethod), "LoRA wraps every matrix"
            slots = method.slots
            table[index] = StackLoRA(
                slots.lora_a.data_ptr(), slots.lora_b_sub.data_ptr(),
                slots.sub_offsets.data_ptr(), slots.sub_offsets.shape[0] - 1,
            )
        return table

    def _lora_step(self) -> StackLoRAStep | None:
        """This step's LoRA tokens and every matrix's slots, or None without adapters."""
        slots, table = self.lora_slots, self.lora_table
        if slots is None or table is None or not slots.batch.active:
            return None
        batch = slots.batch
        assert batch.order is not None and batch.order_slots is not None
        return StackLoRAStep(
            num=batch.order.shape[0], rank=slots.max_rank, order=batch.order.data_ptr(),
            order_slots=batch.order_slots.data_ptr(),
            matrices=ctypes.cast(table, ctypes.c_void_p),
        )
