"""Fused bfloat16 element-wise ops for CPUs (csrc/cpu_ops.c), with torch ops as fallback,
and the int4/int8 x int8 matmul (csrc/w4a8.c, see quantization.W4A8Weight).

A decode step of a small model on CPU is dominated by per-op overhead: RMSNorm with its
residual add is a dozen torch ops, RoPE seven, SiLU- or GELU-and-mul three, each a few microseconds
of dispatch for a few thousand values. These run as one C call each, reproducing the torch
chains' bfloat16 roundings. They serve bfloat16 on CPU only; float32 (the token-exact
reference path) and every other case keep the torch ops. PAGEDLLM_FUSED_OPS=torch switches
them off.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from pagedllm.kernels import pointer
from pagedllm.kernels.abi import STACK_GELU_TANH, STACK_QUICK_GELU, STACK_RELU
from pagedllm.platform import cpu_platform


def _fused_lib() -> Any:
    """The kernel library's handle when the fused ops are on (asserted by callers)."""
    library = cpu_platform().kernel_library()
    assert library is not None and cpu_platform().fused_ops()
    return library.lib


def fused_ops_available() -> bool:
    """True when the fused element-wise ops serve here (the platform's answer)."""
    return cpu_platform().fused_ops()


def w4a8_available() -> bool:
    """True when the int4/int8 x int8 kernels serve bfloat16 models here (the platform's
    answer: a vector variant loaded, never the scalar reference, which torch outruns)."""
    return cpu_platform().byte_dot_kernels(torch.bfloat16)


def serves(x: torch.Tensor) -> bool:
    """True when the fused ops can take this activation: 2-D bfloat16 in host memory (the C
    functions read it there), rows dense, and the platform has them on."""
    return (
        x.dtype == torch.bfloat16
        and x.is_cpu
        and x.dim() == 2
        and x.stride(1) == 1
        and fused_ops_available()
    )


def add_rms_norm(
    x: torch.Tensor,  # [T, H] bfloat16
    residual: torch.Tensor | None,  # [T, H] float32, updated in place
    weight: torch.Tensor,  # [H] bfloat16
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * rms_norm(x + residual) in bfloat16, x + residual in float32)."""
    return _add_norm("add_rms_norm_bf16", x, residual, [pointer(weight)], eps)


def add_layer_norm(
    x: torch.Tensor,  # [T, H] bfloat16
    residual: torch.Tensor | None,  # [T, H] float32, updated in place
    weight: torch.Tensor,  # [H] bfloat16
    bias: torch.Tensor | None,  # [H] bfloat16
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual) * weight + bias in bfloat16, x + residual in float32)."""
    params = [pointer(weight), None if bias is None else pointer(bias)]
    return _add_norm("add_layer_norm_bf16", x, residual, params, eps)


def _add_norm(
    function: str, x: torch.Tensor, residual: torch.Tensor | None, params: list[Any], eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused norm call: (normed x + residual in bfloat16, the float32 residual)."""
    num_tokens, hidden = x.shape
    has_residual = residual is not None
    if residual is None:
        residual = torch.empty(num_tokens, hidden, dtype=torch.float32)
    out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16)
    getattr(_fused_lib(), function)(
        num_tokens, hidden, pointer(x), x.stride(0), pointer(residual), has_residual, *params,
        pointer(out), eps,
    )
    return out, residual


# The plain activations activation_bf16 computes, by kernels.h's codes.
PLAIN_ACTIVATIONS = {"gelu_tanh": STACK_GELU_TANH, "relu": STACK_RELU}


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """x [T, d] bfloat16 → act(x) for `name` in PLAIN_ACTIVATIONS."""
    return _activation(PLAIN_ACTIVATIONS[name], x)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x [T, d] bfloat16 → CLIP's x * sigmoid(1.702 x), rounded as torch's three ops round
    it, in one pass (the vision towers' MLPs; torch takes three passes over the rows)."""
    return _activation(STACK_QUICK_GELU, x)


def _activation(code: int, x: torch.Tensor) -> torch.Tensor:
    library = _fused_lib()
    num_tokens, width = x.shape
    out = torch.empty(num_tokens, width, dtype=torch.bfloat16)
    library.activation_bf16(code, num_tokens, width, pointer(x), x.stride(0), pointer(out))
    return out


def moe(table: Any, activation: int, x: torch.Tensor) -> torch.Tensor:
    """A sparse MLP (csrc/moe.c) of x [T, hidden] bfloat16 with the weights `table` (a
    kernels.abi.StackMoE) points to → [T, hidden]."""
    library = _fused_lib()
    x = x.contiguous()
    out = torch.empty_like(x)
    failed = library.moe_bf16(
        ctypes.byref(table), x.shape[0], x.shape[1], activation, pointer(x), pointer(out)
    )
    if failed:
        raise RuntimeError(f"moe_bf16 failed (code {failed}).")
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2d] (gate | up) bfloat16 → silu(gate) * up [T, d]."""
    return _gated("silu_and_mul_bf16", x)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2d] (gate | up) bfloat16 → gelu_tanh(gate) * up [T, d] (GeGLU)."""
    return _gated("gelu_tanh_and_mul_bf16", x)


def _gated(function: str, x: torch.Tensor) -> torch.Tensor:
    library = _fused_lib()
    num_tokens, width = x.shape
    out = torch.empty(num_tokens, width // 2, dtype=torch.bfloat16)
    getattr(library, function)(num_tokens, width // 2, pointer(x), x.stride(0), pointer(out))
    return out


def rope_neox_(
    x: torch.Tensor,  # [T, heads * head_size] bfloat16, rotated in place
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_position, rotary_dim] float32 (cos | sin)
    head_size: int,
) -> None:
    """Rotate every head of `x` in place by its token's position (neox pairing)."""
    library = _fused_lib()
    num_tokens, width = x.shape
    library.rope_neox_bf16(
        num_tokens, width // head_size, head_size, cos_sin_cache.shape[1], pointer(x),
        x.stride(0), pointer(positions), pointer(cos_sin_cache),
    )


def finite_rows(x: torch.Tensor) -> torch.Tensor:  # x [T, H] bfloat16 → [T] bool
    """Which rows of x hold no NaN or infinity (one pass in C; torch's isfinite + all are
    two ops and a temporary)."""
    finite = torch.empty(x.shape[0], dtype=torch.bool)
    if x.shape[0]:
        _fused_lib().finite_rows_bf16(x.shape[0], x.shape[1], pointer(x), x.stride(0),
                                      pointer(finite))
    return finite


def w4a8_matmul(
    x: torch.Tensor,  # [T, K] bfloat16, rows dense
    packed: torch.Tensor,  # [panels, K / 32, 256] uint8
    scales_and_mins: torch.Tensor,  # [panels, K / 32, 2 or 1, 16] float32 or float16
    out_features: int,
) -> torch.Tensor:  # [T, out_features] bfloat16
    """x @ W^T for W in the W4A8Weight layout; activations quantized per 16 values. float16
    scales take the float16 kernels; [.., 1, 16] holds scales alone (minimums -8 d)."""
    if scales_and_mins.dtype != torch.float16:
        function = "w4a8_matmul_bf16"
    elif scales_and_mins.shape[2] == 1:
        function = "w4a8_sym_f16_matmul_bf16"
    else:
        function = "w4a8_f16_matmul_bf16"
    return _byte_dot_matmul(function, x, packed, scales_and_mins, out_features)


def w8a8_matmul(
    x: torch.Tensor,  # [T, K] bfloat16, rows dense
    codes: torch.Tensor,  # [panels, K / 32, 512] uint8 (q + 128)
    scales: torch.Tensor,  # [panels, K / 32, 16] float32
    out_features: int,
) -> torch.Tensor:  # [T, out_features] bfloat16
    """x @ W^T for W in the W8A8Weight layout; activations quantized per 16 values."""
    return _byte_dot_matmul("w8a8_matmul_bf16", x, codes, scales, out_features)


def bf16_matmul(
    x: torch.Tensor,  # [T, K] bfloat16, rows dense
    panels: torch.Tensor,  # [panels, K / 2, 16, 2] bfloat16
    out_features: int,
) -> torch.Tensor:  # [T, out_features] bfloat16
    """x @ W^T for W in the Bf16PanelWeight layout (csrc/bf16_matmul.c)."""
    return _kernel_matmul("bf16_matmul_bf16", x, (panels,), out_features,
                          ValueError, "the input size is odd")


def _byte_dot_matmul(
    function: str, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, out_features: int
) -> torch.Tensor:
    return _kernel_matmul(function, x, (codes, scales), out_features,
                          MemoryError, "input size not a multiple of 32, or out of memory")


def _kernel_matmul(
    function: str, x: torch.Tensor, weights: tuple[torch.Tensor, ...], out_features: int,
    error: type[Exception], reason: str,
) -> torch.Tensor:
    """out [T, out_features] bfloat16 from one of the matmul kernels, whose arguments are
    (M, N, K, x, x_stride, *weights, out, out_stride); `error` ("function: reason") raised on
    a non-zero code (built only then: these calls are on every step's path)."""
    library = cpu_platform().kernel_library()
    assert library is not None
    num_tokens, in_features = x.shape
    out = torch.empty(num_tokens, out_features, dtype=torch.bfloat16)
    if num_tokens == 0:
        return out
    failed = getattr(library.lib, function)(
        num_tokens, out_features, in_features, pointer(x), x.stride(0),
        *(pointer(w) for w in weights), pointer(out), out_features,
    )
    if failed:
        raise error(f"{function}: {reason}")
    return out


def refine_top(
    logits: torch.Tensor,  # [M, N] bfloat16, rows dense
    hidden: torch.Tensor,  # [M, K] bfloat16, rows dense
    weight: torch.Tensor,  # [N, K] bfloat16, contiguous
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, k] int64, [M, k] float32)
    """Each row's top k logits' ids and their float32 logits recomputed from the dense
    weight (csrc/lm_head.c; ties keep the lower id)."""
    num_rows, vocab = logits.shape
    ids = torch.empty(num_rows, k, dtype=torch.int64)
    exact = torch.empty(num_rows, k, dtype=torch.float32)
    if num_rows == 0:
        return ids, exact
    failed = _fused_lib().refine_top_bf16(
        num_rows, vocab, hidden.shape[1], pointer(logits), logits.stride(0), pointer(hidden),
        hidden.stride(0), pointer(weight), k, pointer(ids), pointer(exact),
    )
    if failed:
        raise MemoryError(f"refine_top_bf16: k={k} outside 1..{vocab}, or out of memory")
    return ids, exact


def greedy_head_scratch_size(matrix: Any, num_rows: int, vocab_size: int) -> int:
    """bfloat16 values `greedy_head` writes its logits to for `num_rows` rows: one
    [rows, vocab] product per part of the head (two where a GGUF tensor is split)."""
    parts = 2 if matrix.parts[1].codes else 1
    return parts * num_rows * vocab_size


def greedy_head(
    matrix: Any,  # kernels.abi.StackMatrix of the head's byte dot-product weight [N, K]
    hidden: torch.Tensor,  # [M, K] bfloat16, rows dense
    weight: torch.Tensor,  # [N, K] bfloat16, contiguous: the dense head
    k: int,
    scratch: torch.Tensor | None = None,  # >= greedy_head_scratch_size values, or None
) -> torch.Tensor:  # [M] int64
    """Each row's greedy token: the head's matmul, its top k refined as `refine_top`, their
    argmax; -1 for a row of `hidden` holding a NaN or infinity. One C call
    (csrc/lm_head.c). The logits go to `scratch` (a caller's buffer kept across steps),
    else to memory allocated for the call."""
    num_rows = hidden.shape[0]
    tokens = torch.empty(num_rows, dtype=torch.int64)
    if num_rows == 0:
        return tokens
    if scratch is not None:
        needed = greedy_head_scratch_size(matrix, num_rows, weight.shape[0])
        if scratch.numel() < needed or scratch.element_size() != 2 or not scratch.is_contiguous():
            raise ValueError(f"greedy_head: scratch needs {needed} contiguous 2-byte values.")
    failed = _fused_lib().greedy_head_bf16(
        ctypes.byref(matrix), num_rows, weight.shape[0], weight.shape[1], pointer(hidden),
        hidden.stride(0), pointer(weight), k, pointer(tokens),
        None if scratch is None else pointer(scratch),
    )
    if failed:
        raise MemoryError(f"greedy_head_bf16 failed (code {failed})")
    return tokens
