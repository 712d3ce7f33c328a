"""The whole decoder stack in one C call for small decode steps on CPU (csrc/decode_stack.c).

A decode step of one token through a 30-layer model is about 400 small ops. Each costs a
few microseconds of Python and torch dispatch, more than the work of most of them: a
single stream spends most of its step there. For bfloat16 Llama-style models whose matrices
are W4A8 weights (int4 quantization, the CPU default), steps made only of decodes (one
token per request, any number of requests) run every layer in one C loop over the
same kernels the Python layers call, in the same order: the result is bit-identical to the
layer-by-layer path (tested), only the dispatch is gone. Where the layers keep dense
weights for large steps (CPUs with matrix units, layers/dense_crossover.py), the stack
takes only the steps small enough for W4A8.

LoRA steps run here too: after each matrix the C loop adds the tokens' adapter deltas
with the kernel the layers' LoRA slots call (csrc/lora.c), unless that step's deltas go to
torch instead (lora/cpu_kernel.py). Anything else (prefills, mixed steps, float32, other
layer types) runs the Python layers. PAGEDLLM_DECODE_STACK=python switches the stack off.
The C loop is csrc/decode_stack.c in the kernels package, built with the other kernels for
this CPU.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, cast

import torch

from pagedllm.attention.cpu_paged import CpuPagedMetadata
from pagedllm.kernels import pointer
from pagedllm.kernels.abi import StackDims, StackLayer, StackLoRA, StackLoRAStep
from pagedllm.layers.activation import SiluAndMul
from pagedllm.layers.forward_context import get_forward_context
from pagedllm.layers.layernorm import RMSNorm
from pagedllm.layers.linear import Linear
from pagedllm.layers.mlp import GatedMLP
from pagedllm.layers.quantization import W4A8Weight
from pagedllm.layers.rotary import RotaryEmbedding
from pagedllm.platform import cpu_platform

if TYPE_CHECKING:
    from pagedllm.models.common import DecoderLayer, DecoderModel

def _library() -> Any:
    """The kernel library's handle, or None when the stack is switched off or its parts are
    (they must run here as they do in the Python layers for the results to agree)."""
    platform = cpu_platform()
    if platform.decode_step_kind() != "cpu_stack":
        return None
    if not (platform.fused_ops() and platform.attention_kernels(torch.bfloat16)):
        return None
    library = platform.kernel_library()
    return None if library is None else library.lib


def _w4a8(linear: Linear) -> W4A8Weight | None:
    quantized = linear.quantized
    if isinstance(quantized, W4A8Weight) and linear.bias is None:
        return quantized
    return None


def _max_quantized_tokens(layers: list[DecoderLayer]) -> int | None:
    """The largest step every layer runs on W4A8 (None: any); larger steps use the dense
    weights the layers also keep where those win (layers/dense_crossover.py)."""
    limits = [
        weight.max_tokens
        for layer in layers
        for linear in _matrices(layer)
        if linear.keeps_dense and (weight := _w4a8(linear)) is not None
        and weight.max_tokens is not None
    ]
    return min(limits) if limits else None


def _decoder_layers(model: DecoderModel) -> list[DecoderLayer]:
    """The model's layers with their type (a ModuleList only knows they are Modules)."""
    return cast("list[DecoderLayer]", list(model.layers))


def _matrices(layer: DecoderLayer) -> tuple[Linear, Linear, Linear, Linear]:
    """A standard layer's qkv, o, gate_up and down projections."""
    mlp = cast("GatedMLP", layer.mlp)
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _rotary(layer: DecoderLayer) -> RotaryEmbedding:
    """A standard layer's rotary embedding (it has one: see _standard_layer)."""
    rotary = layer.self_attn.rotary_emb
    assert rotary is not None
    return rotary


def _standard_layer(layer: DecoderLayer) -> bool:
    """True when `layer` is exactly the Llama block the C loop implements: RMSNorm before
    attention and MLP (no sandwich norms, no q/k norms), neox RoPE over whole heads, full
    attention (no window), a SiLU-gated MLP (no experts), W4A8 matrices without biases.
    Llama, Mistral without a window and Phi-3 qualify. Other layers (Qwen2's q/k/v biases,
    Gemma 3, Qwen3, GPT-2, OPT, MoE, sliding windows) run the Python layers:
    csrc/decode_stack.c would need their parts first (tests/models/test_model_parity.py
    pins which architectures it serves)."""
    from pagedllm.models.common import DecoderAttention, DecoderLayer

    attn, mlp = layer.self_attn, layer.mlp
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    return (
        type(layer) is DecoderLayer
        and not layer.sandwich
        and type(attn) is DecoderAttention
        and attn.q_norm is None
        and attn.attn.sliding_window is None
        and type(mlp) is GatedMLP
        and type(mlp.act_fn) is SiluAndMul
        and type(attn.rotary_emb) is RotaryEmbedding
        and attn.rotary_emb.rotary_dim == attn.rotary_emb.head_size
        and all(type(n) is RMSNorm and n.weight.dtype == torch.bfloat16 for n in norms)
        and all(_w4a8(linear) is not None for linear in _matrices(layer))
        and all(linear.input_perm is None for linear in _matrices(layer))  # act-order GPTQ
    )


class CpuDecodeStack:
    """Runs a DecoderModel's layers for decode-only steps in one C call.

    Build it with `CpuDecodeStack.build(model)`, which returns None when the model does not
    qualify. It holds no weights of its own: only pointers into the model's tensors.
    """

    def __init__(self, model: DecoderModel, library: Any) -> None:
        self.library = library
        self.layers = _decoder_layers(model)
        first = self.layers[0]
        attn = first.self_attn.attn
        self.rotary = _rotary(first)
        self.dims = StackDims(
            num_layers=len(self.layers),
            hidden=first.input_layernorm.hidden_size,
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads,
            head_size=attn.head_size,
            intermediate=_matrices(first)[3].input_size,
            rot_dim=self.rotary.cos_sin_cache.shape[1],
            eps=first.input_layernorm.eps,
            scale=attn.scale,
        )
        self._table: ctypes.Array[StackLayer] | None = None
        self._table_key: tuple[int, ...] = ()
        self._lora_table: ctypes.Array[StackLoRA] | None = None
        self.max_tokens = _max_quantized_tokens(self.layers)

    @classmethod
    def build(cls, model: DecoderModel) -> CpuDecodeStack | None:
        """The stack for `model`, or None: it needs bfloat16 Llama-style layers with W4A8
        matrices, no biases, neox RoPE with a float32 table, and the C library."""
        layers = _decoder_layers(model)
        if not layers or not all(_standard_layer(layer) for layer in layers):
            return None
        rotary = _rotary(layers[0])
        if any(layer.self_attn.rotary_emb is not rotary for layer in layers):
            return None
        if rotary.cos_sin_cache.dtype != torch.float32 or rotary.head_size != (
            layers[0].self_attn.attn.head_size
        ):
            return None
        library = _library()
        return None if library is None else cls(model, library)

    def serves(self, hidden_states: torch.Tensor, positions: torch.Tensor) -> bool:
        """True when this step is for the stack: decodes only, read by the C attention
        kernel from int8 caches."""
        num_tokens = hidden_states.shape[0]
        if num_tokens == 0 or positions.dtype != torch.int64:
            return False
        if self.max_tokens is not None and num_tokens > self.max_tokens:
            return False  # the layers' dense weights are faster for this step
        lora = self._lora_slots()
        if lora is not None and lora.batch.active and not lora.kernel_serves(num_tokens):
            return False  # LoRA deltas the C kernel does not take this step
        context = get_forward_context()
        metadata = context.attn_metadata
        return (
            isinstance(metadata, CpuPagedMetadata)
            and context.layer_metadata is None  # one block table for all layers
            and metadata.decodes_only() is not None
            and len(context.kv_caches) == len(self.layers)
            and context.kv_caches[0].dtype == torch.int8
        )

    def __call__(
        self, hidden_states: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings [T, hidden] → (last layer's MLP output, residual [T, hidden] float32),
        as the Python layers would return them. Call only when `serves` said yes."""
        context = get_forward_context()
        metadata = context.attn_metadata
        decodes = metadata.decodes_only()
        assert decodes is not None, "call serves() first"
        table = self._layer_table(context.kv_caches)
        self.dims.max_blocks = decodes.block_tables.shape[1]  # changes from step to step
        num_tokens, hidden = hidden_states.shape
        out = hidden_states.contiguous().clone()
        residual = torch.empty(num_tokens, hidden, dtype=torch.float32)
        slots = metadata.slot_mapping.to(torch.int64).contiguous()
        lora_step = self._lora_step()
        failed = self.library.decode_stack_bf16(
            ctypes.byref(self.dims), table, num_tokens,
            pointer(out), pointer(residual), pointer(positions),
            pointer(self.rotary.cos_sin_cache), pointer(slots),
            pointer(decodes.block_tables), pointer(decodes.seq_lens),
            pointer(decodes.token_rows), decodes.max_seq_len,
            None if lora_step is None else ctypes.byref(lora_step),
        )
        if failed:
            raise RuntimeError(f"The CPU decode stack failed (code {failed}).")
        return out, residual

    def _layer_table(self, kv_caches: list[torch.Tensor]) -> ctypes.Array[StackLayer]:
        """The per-layer pointer table, rebuilt only when the KV caches change."""
        key = (kv_caches[0].shape[1], *(cache.data_ptr() for cache in kv_caches))
        if self._table is not None and key == self._table_key:
            return self._table
        _, num_blocks, block_size, _, _ = kv_caches[0].shape
        self.dims.num_blocks, self.dims.block_size = num_blocks, block_size
        table = (StackLayer * len(self.layers))()
        for entry, layer, kv_cache in zip(table, self.layers, kv_caches, strict=True):
            weights = [_w4a8(linear) for linear in _matrices(layer)]
            norms = cast("tuple[RMSNorm, RMSNorm]", (layer.input_layernorm,
                                                     layer.post_attention_layernorm))
            entry.input_norm, entry.post_norm = (norm.weight.data_ptr() for norm in norms)
            entry.qkv, entry.o, entry.gate_up, entry.down = (
                w.packed.data_ptr() for w in weights  # type: ignore[union-attr]
            )
            entry.qkv_dm, entry.o_dm, entry.gate_up_dm, entry.down_dm = (
                w.scales_and_mins.data_ptr() for w in weights  # type: ignore[union-attr]
            )
            entry.kv_cache = kv_cache.data_ptr()
        self._table, self._table_key = table, key
        return table

    # LoRA: the layers' adapter slots (lora/layers.py, duck-typed: models/ does not import
    # lora/) feed the same C kernel the Python layers call, after each matrix.

    def _lora_slots(self) -> Any:
        """The first matrix's LoRA slots (every matrix has them when LoRA is on), or None."""
        return _matrices(self.layers[0])[0].lora

    def _lora_step(self) -> StackLoRAStep | None:
        """This step's LoRA tokens and every matrix's slots, or None without adapters."""
        lora = self._lora_slots()
        if lora is None or not lora.batch.active:
            return None
        if self._lora_table is None:
            self._lora_table = self._build_lora_table()
        batch = lora.batch
        return StackLoRAStep(
            num=batch.order.shape[0], rank=lora.max_rank, order=batch.order.data_ptr(),
            order_slots=batch.order_slots.data_ptr(),
            matrices=ctypes.cast(self._lora_table, ctypes.c_void_p),
        )

    def _build_lora_table(self) -> ctypes.Array[StackLoRA]:
        """Pointers to every matrix's slot weights (written in place as adapters change)."""
        table = (StackLoRA * (4 * len(self.layers)))()
        for index, linear in enumerate(m for layer in self.layers for m in _matrices(layer)):
            slots = linear.lora
            table[index] = StackLoRA(
                slots.lora_a.data_ptr(), slots.lora_b_sub.data_ptr(),
                slots.sub_offsets.data_ptr(), slots.sub_offsets.shape[0] - 1,
            )
        return table
