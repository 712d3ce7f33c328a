"""The C kernel library's interface as ctypes sees it: every function of csrc/kernels.h with
its argument and return types, and the structs they take, declared once.

`loader.open_library` applies these declarations to a loaded variant, so a Python wrapper
(layers/cpu_ops.py, attention/cpu_kernel.py, lora/cpu_kernel.py, the worker's CPU decode
stack) passes plain ints, floats and pointers and ctypes checks them against the header's
types. A function added to kernels.h is declared here too (tests/kernels/test_abi.py
compares the two). Pure data: nothing is loaded or built here.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

_I32, _I64, _F32 = ctypes.c_int32, ctypes.c_int64, ctypes.c_float
# Every pointer argument (tensors' data, structs by reference) is a void pointer here:
# the header's element types are documented beside each argument below.
_PTR = ctypes.c_void_p


class PagedDims(ctypes.Structure):
    """kernels.h PagedDims: the paged KV cache's shape and the query heads (window 0:
    full attention)."""

    _fields_ = [
        (name, _I64)
        for name in (
            "num_blocks", "block_size", "num_kv_heads", "num_heads", "head_size",
            "max_blocks", "window",
        )
    ]


class StackDims(ctypes.Structure):
    """kernels.h StackDims: the decoder stack's shapes, its KV caches' geometry, its MLP
    (gated or plain, and the activation: STACK_SILU / STACK_GELU_TANH / STACK_RELU) and
    norm kind (RMSNorm or LayerNorm), the final norm's weights and the token embedding
    (NULL: the caller's) with its scale (0: none)."""

    _fields_ = [
        *((name, _I64) for name in (
            "num_layers", "hidden", "num_heads", "num_kv_heads", "head_size", "intermediate",
            "num_blocks", "block_size", "kv_bf16", "activation", "gated", "layer_norm",
        )),
        ("eps", _F32), ("scale", _F32), ("final_norm", _PTR), ("final_norm_bias", _PTR),
        ("embedding", _PTR), ("vocab_size", _I64), ("embedding_scale", _F32),
    ]


STACK_SILU, STACK_GELU_TANH, STACK_RELU = 0, 1, 2
STACK_QUICK_GELU = 3  # activation_bf16 only (vision towers), never a stack's MLP


# The byte dot products' weight formats (kernels.h FMT_*): int4 codes with float32 (d, m),
# int8 codes, int4 codes with float16 (d, m), int4 codes with float16 d alone (m = -8 d).
FMT_INT4, FMT_INT8, FMT_INT4_F16, FMT_INT4_SYM_F16 = 0, 1, 2, 3
# Dense bfloat16 weights in panels of 16 rows (csrc/bf16_matmul.c; no scales).
FMT_BF16 = 4


class StackWeight(ctypes.Structure):
    """kernels.h StackWeight: one byte dot-product weight (codes NULL: none) in a format
    (FMT_*)."""

    _fields_ = [("codes", _PTR), ("scales", _PTR), ("format", _I64)]


class StackMatrix(ctypes.Structure):
    """kernels.h StackMatrix: one weight or two summed (a split GGUF format), a bias, and
    the weight steps of at least `large_from` tokens take instead (codes NULL: none)."""

    _fields_ = [("parts", StackWeight * 2), ("bias", _PTR), ("large", StackWeight),
                ("large_from", _I64)]


class StackMoE(ctypes.Structure):
    """kernels.h StackMoE: a sparse MLP's router, experts (arrays of StackMatrix) and
    shared expert with its gate."""

    _fields_ = [
        *((name, _I64) for name in (
            "num_experts", "top_k", "renormalize", "intermediate", "shared_intermediate",
        )),
        ("router", _PTR), ("gate_up", _PTR), ("down", _PTR),
        ("shared_gate_up", StackMatrix), ("shared_down", StackMatrix), ("shared_gate", _PTR),
    ]


class StackLayer(ctypes.Structure):
    """kernels.h StackLayer: one decoder layer's norms, matrices, RoPE table, window, KV
    cache group and KV cache (a NULL norm: the layer has none)."""

    _fields_ = [
        *((name, _PTR) for name in (
            "input_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm",
            "input_norm_bias", "post_attn_norm_bias", "q_norm", "k_norm",
        )),
        *((name, StackMatrix) for name in ("qkv", "o", "gate_up", "down")),
        ("moe", _PTR), ("cos_sin", _PTR), ("rot_dim", _I64), ("window", _I64), ("group", _I64),
        ("kv_cache", _PTR),
    ]


class StackGroup(ctypes.Structure):
    """kernels.h StackGroup: one KV cache group's slots and block tables for a step."""

    _fields_ = [("slots", _PTR), ("block_tables", _PTR), ("max_blocks", _I64),
                ("prefill_block_tables", _PTR), ("prefill_max_blocks", _I64)]


class StackPrefills(ctypes.Structure):
    """kernels.h StackPrefills: a mixed step's prefill chunks beside its decodes."""

    _fields_ = [("num_decodes", _I64), ("num", _I64), ("query_starts", _PTR),
                ("query_lens", _PTR), ("context_lens", _PTR), ("max_seq_len", _I64)]


class StackLoRA(ctypes.Structure):
    """kernels.h StackLoRA: one matrix's adapter slots (a NULL: none on it)."""

    _fields_ = [("a", _PTR), ("b", _PTR), ("sub_offsets", _PTR), ("subs", _I64)]


class StackLoRAStep(ctypes.Structure):
    """kernels.h StackLoRAStep: a step's LoRA tokens and every matrix's slots."""

    _fields_ = [("num", _I64), ("rank", _I64), ("order", _PTR), ("order_slots", _PTR),
                ("matrices", _PTR)]


@dataclass(frozen=True)
class Function:
    """One exported function: its name, its argument types in order, its return type."""

    name: str
    argtypes: tuple[type, ...]
    restype: type | None


# paged_decode_*(dims, query, out, kv_cache, block_tables, seq_lens, token_rows, num_reqs,
# max_seq_len, scale): 0, or non-zero when out of memory.
_DECODE_ARGS = (_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32)
# paged_prefill_*(dims, query, q_stride, out, kv_cache, block_tables, query_starts,
# query_lens, context_lens, num_reqs, max_seq_len, scale).
_PREFILL_ARGS = (_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32)
# store_int8_*(dims, kv_cache, key, value, key_stride, value_stride, slots, num_tokens,
# write_back).
_STORE_ARGS = (_PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64, _I32)
# w4a8 / w4a8_f16 / w4a8_sym_f16 / w8a8_matmul_bf16(M, N, K, x, x_stride, qs, dm, out,
# out_stride): 1 when K % 32, 2 when out of memory.
_BYTE_DOT_ARGS = (_I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64)

FUNCTIONS: tuple[Function, ...] = (
    Function("pagedllm_isa", (), ctypes.c_char_p),
    *(Function(f"paged_decode_{kind}", _DECODE_ARGS, ctypes.c_int)
      for kind in ("f32", "bf16", "f32_int8", "bf16_int8")),
    *(Function(f"paged_prefill_{kind}", _PREFILL_ARGS, ctypes.c_int)
      for kind in ("f32", "bf16", "f32_int8", "bf16_int8")),
    # dense_attention_bf16(B, N, H, D, q, k, v, out, scale)
    Function(
        "dense_attention_bf16", (_I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _F32),
        ctypes.c_int,
    ),
    Function("store_int8_f32", _STORE_ARGS, None),
    Function("store_int8_bf16", _STORE_ARGS, None),
    # add_rms_norm_bf16(T, H, x, x_stride, residual, has_residual, weight, out, eps)
    Function("add_rms_norm_bf16", (_I64, _I64, _PTR, _I64, _PTR, _I32, _PTR, _PTR, _F32), None),
    # silu_and_mul_bf16(T, d, x, x_stride, out)
    Function("silu_and_mul_bf16", (_I64, _I64, _PTR, _I64, _PTR), None),
    # add_layer_norm_bf16(T, H, x, x_stride, residual, has_residual, weight, bias, out, eps)
    Function(
        "add_layer_norm_bf16",
        (_I64, _I64, _PTR, _I64, _PTR, _I32, _PTR, _PTR, _PTR, _F32), None,
    ),
    # activation_bf16(kind, T, d, x, x_stride, out)
    Function("activation_bf16", (_I64, _I64, _I64, _PTR, _I64, _PTR), None),
    # gelu_tanh_and_mul_bf16(T, d, x, x_stride, out)
    Function("gelu_tanh_and_mul_bf16", (_I64, _I64, _PTR, _I64, _PTR), None),
    # finite_rows_bf16(T, H, x, x_stride, finite): the number of rows with NaN or infinity
    Function("finite_rows_bf16", (_I64, _I64, _PTR, _I64, _PTR), ctypes.c_int64),
    # rope_neox_bf16(T, heads, head_size, rot_dim, x, x_stride, positions, cos_sin)
    Function("rope_neox_bf16", (_I64, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR), None),
    Function("w4a8_matmul_bf16", _BYTE_DOT_ARGS, ctypes.c_int),
    Function("w4a8_f16_matmul_bf16", _BYTE_DOT_ARGS, ctypes.c_int),
    Function("w4a8_sym_f16_matmul_bf16", _BYTE_DOT_ARGS, ctypes.c_int),
    Function("w8a8_matmul_bf16", _BYTE_DOT_ARGS, ctypes.c_int),
    # bf16_matmul_bf16(M, N, K, x, x_stride, panels, out, out_stride): 1 when K is odd
    Function("bf16_matmul_bf16", (_I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64), ctypes.c_int),
    # bf16_matrix_units(): 1 when bf16_matmul_bf16 runs on matrix units (AMX tiles)
    Function("bf16_matrix_units", (), ctypes.c_int),
    # lora_add_bf16(num, K, N, x, x_stride, out, out_stride, order, order_slots, subs,
    # sub_offsets, R, A, B): 2 when out of memory.
    Function(
        "lora_add_bf16",
        (_I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR),
        ctypes.c_int,
    ),
    # moe_bf16(moe, T, hidden, activation, x, out): 0, or non-zero on failure.
    Function("moe_bf16", (_PTR, _I64, _I64, _I64, _PTR, _PTR), ctypes.c_int),
    # refine_top_bf16(M, N, K, logits, logits_stride, x, x_stride, weight, k, ids, exact)
    Function(
        "refine_top_bf16",
        (_I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR),
        ctypes.c_int,
    ),
    # greedy_head_bf16(head, M, N, K, x, x_stride, weight, k, tokens, scratch)
    Function(
        "greedy_head_bf16",
        (_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR),
        ctypes.c_int,
    ),
    # decode_stack_bf16(dims, layers, T, input_ids, hidden, residual, positions, groups,
    # seq_lens, token_rows, max_seq_len, lora, prefills)
    Function(
        "decode_stack_bf16",
        (_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR),
        ctypes.c_int,
    ),
    # decode_greedy_steps(dims, layers, T, steps, input_ids, hidden, residual, positions,
    # groups, num_groups, seq_lens, token_rows, lora, head, N, weight, k, scratch, tokens,
    # steps_done, stop_ids, stop_width)
    Function(
        "decode_greedy_steps",
        (_PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR,
         _I64, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64),
        ctypes.c_int,
    ),
)


def declare(lib: ctypes.CDLL) -> None:
    """Set every function's argument and return types on a loaded library."""
    for function in FUNCTIONS:
        handle = getattr(lib, function.name)
        handle.argtypes = list(function.argtypes)
        handle.restype = function.restype
