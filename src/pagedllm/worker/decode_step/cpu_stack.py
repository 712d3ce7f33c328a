"""The whole decoder stack in one C call for decode (and mixed) steps on CPU
(csrc/decode_stack.c).

A decode step of one token through a 30-layer model is about 400 small ops. Each costs a
few microseconds of Python and torch dispatch, more than the work of most of them: a
single stream spends most of its step there. For bfloat16 models whose matrices are byte
dot-product weights (W4A8 / W8A8: int4 quantization, the CPU default, and GGUF files) or
dense bf16 panels (no quantization, where our bf16 kernel serves: bf16_panels.py),
decode steps (one token per row, any number of rows) run the embedding
lookup, every layer in one C loop over the same kernels the Python layers call, in the
same order, and the final norm: the result is bit-identical to the model's forward
(tested), only the dispatch is gone. cpu_stack_layers.py says which layers qualify
(Llama, Mistral, Phi-3, Qwen2, Qwen3, Gemma 3 and their windowed and hybrid variants,
GPT-2, OPT).
Where layers keep torch's dense weights for large steps (CPUs with matrix units: a quantized
layer's crossover, layers/quantization/crossover.py, and the bf16 panels' own,
bf16_panels.py), the stack takes only the steps its tables multiply: up to the panels'
limit, which the worker may raise where whole steps are measured faster here
(stack_reach.py; the layers' panels then follow, so both stay bit-identical).

Steps that mix decodes with prefill chunks (chunked prefill beside running requests: most
serving steps that admit a request) run here as well: the C loop attends the chunks with the
prefill kernel and the decodes with the decode kernel, as the Python layers' backend does,
so they too are bit-identical; a chunked prefill under a small step budget then costs the
layers' dispatch no more (measured: benchmarks/serving.py with --max-num-batched-tokens).
LoRA steps run here too: after each matrix the C loop adds the tokens' adapter deltas
with the kernel the layers' LoRA slots call (csrc/lora.c), unless that step's deltas go to
torch instead (lora/cpu_kernel.py). Anything else (float32, other layer types, multimodal
steps) runs the Python layers. PAGEDLLM_DECODE_STACK=python switches the stack off.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from pagedllm.kernels import pointer
from pagedllm.kernels.abi import (
    StackDims,
    StackGroup,
    StackLayer,
    StackLoRA,
    StackLoRAStep,
    StackPrefills,
)
from pagedllm.layers.cpu_tables import stack_capacity
from pagedllm.lora.layers import LoRALinearMethod, LoRALinearSlots
from pagedllm.models.common import DecoderLayer, DecoderModel
from pagedllm.platform import cpu_platform
from pagedllm.worker.decode_step.base import (
    DecodeBatch,
    DecodeStep,
    GreedyHead,
    StepRequests,
)
from pagedllm.worker.decode_step.cpu_stack_layers import (
    activation_of,
    dense_mlp,
    fill_layer,
    final_norm_pointers,
    is_layer_norm,
    matrices,
    max_stack_tokens,
    moe_of,
    plain_embedding,
    shared_shape,
    stack_layer,
)

if TYPE_CHECKING:
    from pagedllm.layers.embedding import GreedyTail


def _library() -> Any:
    """The kernel library's handle, or None when the stack's parts are off here (they must
    run here as they do in the Python layers for the results to agree)."""
    platform = cpu_platform()
    if not (platform.fused_ops() and platform.attention_kernels(torch.bfloat16)):
        return None
    library = platform.kernel_library()
    return None if library is None else library.lib


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
    """Every layer one the C loop implements, all of one shape (cpu_stack_layers.py); layers
    without RoPE only where the embedding adds learned positions."""
    layers = list(decoder.layers)
    if not layers or not all(stack_layer(layer) for layer in layers):
        return False
    unrotated = any(
        cast(DecoderLayer, layer).self_attn.rotary_emb is None for layer in layers
    )
    if unrotated and decoder.embed_positions is None:
        return False
    return shared_shape(cast("list[DecoderLayer]", layers))


class CpuDecodeStack(DecodeStep):
    """Runs a decoder model's decode and mixed steps in one C call (module docstring).

    Build it with `CpuDecodeStack.build`, which returns None when the model or the cache
    does not qualify. It holds no weights of its own: only pointers into the model's tensors
    and its KV caches, written once.
    """

    def __init__(
        self, decoder: DecoderModel, kv_caches: list[torch.Tensor], group_of_layer: list[int],
        library: Any,
    ) -> None:
        self.decoder = decoder
        self.library = library
        self.layers = cast("list[DecoderLayer]", list(decoder.layers))
        self.num_groups = max(group_of_layer) + 1
        first = self.layers[0]
        attn = first.self_attn.attn
        _, num_blocks, block_size, _, _ = kv_caches[0].shape
        activation = activation_of(first)
        assert activation is not None
        intermediate, gated = dense_mlp(self.layers)
        self.dims = StackDims(
            num_layers=len(self.layers),
            hidden=first.input_layernorm.hidden_size,
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads,
            head_size=attn.head_size,
            intermediate=intermediate,
            num_blocks=num_blocks,
            block_size=block_size,
            kv_bf16=int(kv_caches[0].dtype == torch.bfloat16),
            activation=activation,
            gated=int(gated),
            layer_norm=int(is_layer_norm(first)),
            eps=first.input_layernorm.eps,
            scale=attn.scale,
        )
        self.dims.final_norm, self.dims.final_norm_bias = final_norm_pointers(
            decoder.norm, first
        )
        embedding = plain_embedding(decoder)
        if embedding is not None:
            table, self.dims.embedding_scale = embedding
            self.dims.embedding, self.dims.vocab_size = table.data_ptr(), table.shape[0]
        self.table = (StackLayer * len(self.layers))()
        for entry, layer, kv_cache, group in zip(
            self.table, self.layers, kv_caches, group_of_layer, strict=True
        ):
            fill_layer(entry, layer, kv_cache, group)
        self.lora_slots = self._lora_slots()
        self.lora_table = self._lora_table() if self.lora_slots is not None else None
        # The largest step it serves (None: any): where every matrix's table is measured
        # the faster method; the worker may raise it up to `capacity`, the largest step the
        # tables can run at all, where whole steps are measured faster here than through
        # the layers (stack_reach.py).
        self.max_tokens = max_stack_tokens(self.layers)
        self.capacity = max_stack_tokens(self.layers, stack_capacity)
        self._greedy_call: _GreedyCall | None = None  # greedy_steps' arrays, kept

    @classmethod
    def build(
        cls, model: nn.Module, kv_caches: list[torch.Tensor],
        group_of_layer: Sequence[int] | None = None,
    ) -> CpuDecodeStack | None:
        """The stack for `model` (a causal LM over a DecoderModel), or None: it needs
        bfloat16 layers the C loop implements, with our kernels' matrices, int8 or
        bfloat16 KV caches of every layer, and the C library's fused ops and attention
        kernels. `group_of_layer`: each layer's KV cache group (None: one group)."""
        decoder = _decoder(model)
        if decoder is None or not _qualifies(decoder):
            return None
        if len(kv_caches) != len(decoder.layers) or kv_caches[0].dtype not in (
            torch.int8, torch.bfloat16
        ):
            return None
        groups = list(group_of_layer) if group_of_layer is not None else [0] * len(kv_caches)
        layers = cast("list[DecoderLayer]", list(decoder.layers))
        has_moe = any(moe_of(layer) is not None for layer in layers)
        if has_moe and isinstance(matrices(layers[0])[0].method, LoRALinearMethod):
            return None  # adapters' slots are the dense matrices' (the C loop's four)
        library = _library()
        return None if library is None else cls(decoder, kv_caches, groups, library)

    takes_mixed_steps = True

    def serves(self, batch: DecodeBatch) -> bool:
        """Steps of at most `max_tokens` rows (our kernels' weights serve them, not kept
        torch dense weights), whose LoRA deltas the C kernel takes, on a model that keeps
        no aux hidden states (EAGLE-3), with a table for each KV cache group."""
        num_rows = batch.num_rows
        if num_rows == 0 or self.decoder.aux_hidden_state_layers:
            return False
        if len(batch.groups) != self.num_groups:
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
        num_tokens = input_ids.shape[0]
        if self.dims.embedding:  # looked up in the call
            hidden = torch.empty(num_tokens, self.dims.hidden, dtype=torch.bfloat16)
        else:
            hidden = self.decoder.embed(input_ids, positions).contiguous()  # [T, hidden]
        residual = torch.empty(num_tokens, hidden.shape[1], dtype=torch.float32)
        attention = _AttentionRows(batch)  # int32 arrays the C call reads: kept alive here
        lora_step = self._lora_step()
        failed = self.library.decode_stack_bf16(
            ctypes.byref(self.dims), self.table, num_tokens, pointer(input_ids),
            pointer(hidden), pointer(residual),
            pointer(positions), attention.groups, pointer(attention.seq_lens),
            pointer(attention.token_rows), attention.max_seq_len,
            None if lora_step is None else ctypes.byref(lora_step),
            None if attention.prefills is None else ctypes.byref(attention.prefills),
        )
        del attention
        if failed == 3:
            raise IndexError("The CPU decode stack: a token id outside the vocabulary.")
        if failed:
            raise RuntimeError(f"The CPU decode stack failed (code {failed}).")
        if not self.dims.final_norm:  # (else applied in the call)
            hidden, _ = self.decoder.norm(hidden, residual)
        return hidden

    def greedy_steps(
        self, batch: DecodeBatch, steps: int, head: GreedyHead,
        stop_ids: np.ndarray | None = None,
    ) -> list[list[int]] | None:
        """`steps` greedy decode steps in one C call (csrc/decode_loop.c: the stack, the
        LM head's greedy tail, the argmax fed back), where the call looks the embeddings
        up and applies the final norm itself and the head's C tail serves; else None.
        Every KV cache group goes in (a windowed model's sliding-window layers keep their
        own table; blocks wholly behind a window may be the null block there: never
        read). The call stops after a step with a non-finite row (-1 there: the last
        step returned), or where a row sampled one of its `stop_ids`
        (DecodeStep.greedy_steps)."""
        dims = self.dims
        if not (dims.embedding and dims.final_norm) or batch.requests is not None:
            return None
        num_rows = batch.num_rows
        groups = batch.groups
        columns = max(table.shape[1] for _, table in groups)
        call = self._greedy_call
        if call is None or not call.fits(num_rows, steps, len(groups), columns):
            call = self._greedy_call = None  # (the old arrays freed first)
            call = self._greedy_call = _GreedyCall(  # room for a context twice as long
                dims, num_rows, max(steps, _GREEDY_STEPS), len(groups),
                max(2 * columns, _GREEDY_BLOCKS))
        tail = call.tail_arguments(head)
        if tail is None:
            return None
        call.load(batch)
        stops = None if stop_ids is None else np.ascontiguousarray(stop_ids, dtype=np.int64)
        lora_step = self._lora_step()
        failed = self.library.decode_greedy_steps(
            call.dims, self.table, num_rows, steps, call.input_ids_pointer,
            call.hidden_pointer, call.residual_pointer, call.positions_pointer,
            call.groups, call.num_groups, call.seq_lens_pointer, call.token_rows_pointer,
            None if lora_step is None else ctypes.byref(lora_step),
            *tail, call.tokens_pointer, call.done_reference,
            None if stops is None else stops.ctypes.data,
            0 if stops is None else stops.shape[1],
        )
        if failed == 3:
            raise IndexError("The CPU decode stack: a token id outside the vocabulary.")
        if failed not in (0, _NONFINITE_ROW):
            raise RuntimeError(f"The CPU greedy decode loop failed (code {failed}).")
        return cast("list[list[int]]", call.tokens[: call.done.value].tolist())

    # LoRA: the layers' adapter slots (lora/layers.py) feed the same C kernel the Python
    # layers call, after each matrix.

    def _lora_slots(self) -> LoRALinearSlots | None:
        """The first matrix's LoRA slots (every matrix has them when LoRA is on), or None."""
        method = matrices(self.layers[0])[0].method
        return method.slots if isinstance(method, LoRALinearMethod) else None

    def _lora_table(self) -> ctypes.Array[StackLoRA]:
        """Pointers to every matrix's slot weights (written in place as adapters change)."""
        table = (StackLoRA * (4 * len(self.layers)))()
        for index, linear in enumerate(m for layer in self.layers for m in matrices(layer)):
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


# csrc/decode_loop.c: a step's row was not finite (its token -1, the step returned).
_NONFINITE_ROW = 16


# greedy_steps' kept arrays start with room for this many steps and block table columns.
_GREEDY_STEPS, _GREEDY_BLOCKS = 8, 64


class _GreedyCall:
    """greedy_steps' arrays for a number of rows, kept from call to call: a batch-1 step's
    host work between two kernel calls is mostly first touches on caches the weights went
    through, so fewer objects a call (no tensors made, pointers and the groups' entries
    written once) is less of it.

    Args:
        dims: the stack's dimensions; rows: the batch rows; steps: room for this many
        steps' tokens; num_groups: the KV cache groups; max_blocks: block table columns
        (the C call's row stride, every group's).
    """

    def __init__(self, dims: StackDims, rows: int, steps: int, num_groups: int,
                 max_blocks: int) -> None:
        self.rows, self.steps, self.max_blocks = rows, steps, max_blocks
        self.num_groups = num_groups
        self.dims = ctypes.byref(dims)
        hidden = dims.hidden
        # The call advances ids, positions and sequence lengths in place, and writes each
        # step's slots over `slots`.
        self.input_ids = np.zeros(rows, dtype=np.int64)
        self.positions = np.zeros(rows, dtype=np.int64)
        self.seq_lens = np.zeros(rows, dtype=np.int32)
        self.token_rows = np.arange(rows, dtype=np.int32)  # decode-only: token t is row t
        # Each group's slots (written by the call each step) and block table.
        self.slots = np.zeros((num_groups, rows), dtype=np.int64)
        self.tables = np.zeros((num_groups, rows, max_blocks), dtype=np.int32)
        self.tokens = np.zeros((steps, rows), dtype=np.int64)
        self.done = ctypes.c_int64(0)
        self.hidden = torch.empty(rows, hidden, dtype=torch.bfloat16)
        self.residual = torch.empty(rows, hidden, dtype=torch.float32)
        self.hidden_pointer = self.hidden.data_ptr()
        self.residual_pointer = self.residual.data_ptr()
        self.input_ids_pointer = self.input_ids.ctypes.data
        self.positions_pointer = self.positions.ctypes.data
        self.seq_lens_pointer = self.seq_lens.ctypes.data
        self.token_rows_pointer = self.token_rows.ctypes.data
        self.tokens_pointer = self.tokens.ctypes.data
        self.done_reference = ctypes.byref(self.done)
        self.groups = (StackGroup * num_groups)()
        for group, entry in enumerate(self.groups):
            entry.slots = self.slots[group].ctypes.data
            entry.block_tables = self.tables[group].ctypes.data
            entry.max_blocks = max_blocks
        self._head: GreedyHead | None = None
        self._tail: GreedyTail | None = None  # (kept alive while its pointers are used)
        self._tail_arguments: tuple[Any, ...] | None = None

    def tail_arguments(self, head: GreedyHead) -> tuple[Any, ...] | None:
        """The C call's arguments for `head`'s greedy tail at these rows (None where the
        tail does not serve them): asked of the head once. Like the stack's own pointers
        into the weights, they hold while the model's tensors do (the worker builds a new
        stack where they change). The tail's logits buffer stays alive with them, also
        once the head has taken a larger one for more rows (one buffer of these rows'
        size at most, until a call of another row count replaces these arrays)."""
        if head is not self._head:
            tail = self._tail = head.greedy_tail(self.hidden)
            self._tail_arguments = None if tail is None else (
                ctypes.byref(tail.matrix), tail.weight.shape[0], tail.weight.data_ptr(),
                tail.k, tail.scratch.data_ptr(),
            )
            self._head = head
        return self._tail_arguments

    def fits(self, rows: int, steps: int, num_groups: int, table_columns: int) -> bool:
        """Whether these arrays serve a call of `rows` rows, `steps` steps and
        `num_groups` block tables of at most `table_columns` columns."""
        return (rows == self.rows and steps <= self.steps and num_groups == self.num_groups
                and table_columns <= self.max_blocks)

    def load(self, batch: DecodeBatch) -> None:
        """Write a decode-only batch into the arrays."""
        self.input_ids[:] = batch.input_ids
        self.positions[:] = batch.positions
        np.add(batch.positions, 1, out=self.seq_lens, casting="unsafe")
        # (the call writes every step's slots from the tables; columns past a table's
        # own are never read)
        for group, (_, block_table) in enumerate(batch.groups):
            self.tables[group, :, : block_table.shape[1]] = block_table


def _int32(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, np.int32))


class _AttentionRows:
    """A step's attention inputs as the C call takes them (the arrays it points into are
    this object's, alive as long as it is): the decode requests' seq_lens, token rows and
    block tables; a mixed step's prefill chunks (StackPrefills) and their tables. The rows
    are split as the Python layers' backend splits them (one query token: a decode)."""

    def __init__(self, batch: DecodeBatch) -> None:
        requests = batch.requests
        if requests is None:  # decode-only: token t is request t
            decodes = np.arange(batch.num_rows)
            token_rows, seq_lens = decodes, batch.positions + 1
            chunks = decodes[:0]
        else:
            decodes = np.flatnonzero(requests.query_lens == 1)
            chunks = np.flatnonzero(requests.query_lens > 1)
            token_rows = requests.query_start_loc[decodes]
            seq_lens = requests.context_lens[decodes] + 1
        self.token_rows, self.seq_lens = _int32(token_rows), _int32(seq_lens)
        # (numpy's max: a torch reduction costs more on this per-step path)
        self.max_seq_len = int(seq_lens.max()) if len(decodes) else 1
        self.keep: list[torch.Tensor] = []
        self.prefills = None if requests is None else self._prefills(requests, decodes, chunks)
        self.groups = (StackGroup * len(batch.groups))()
        for entry, (slot_mapping, block_table) in zip(self.groups, batch.groups, strict=True):
            slots = torch.from_numpy(slot_mapping.astype(np.int64, copy=False))
            tables = _int32(block_table[decodes] if requests is not None else block_table)
            entry.slots, entry.block_tables = pointer(slots), pointer(tables)
            entry.max_blocks = tables.shape[1]  # changes from step to step
            self.keep += [slots, tables]
            if len(chunks):
                chunk_tables = _int32(block_table[chunks])
                entry.prefill_block_tables = pointer(chunk_tables)
                entry.prefill_max_blocks = chunk_tables.shape[1]
                self.keep.append(chunk_tables)

    def _prefills(
        self, requests: StepRequests, decodes: np.ndarray, chunks: np.ndarray
    ) -> StackPrefills:
        starts, lens = requests.query_start_loc[chunks], requests.query_lens[chunks]
        contexts = requests.context_lens[chunks]
        arrays = [_int32(starts), _int32(lens), _int32(contexts)]
        self.keep += arrays
        longest = int((contexts + lens).max()) if len(chunks) else 1
        return StackPrefills(len(decodes), len(chunks), *(pointer(a) for a in arrays), longest)
