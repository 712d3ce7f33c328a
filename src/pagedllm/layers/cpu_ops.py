"""Fused bfloat16 element-wise ops for CPUs (csrc/cpu_ops.c), with torch ops as fallback,
and the int4/int8 x int8 matmul (csrc/w4a8.c, see quantization.W4A8Weight).

A decode step of a small model on CPU is dominated by per-op overhead: RMSNorm with its
residual add is a dozen torch ops, RoPE seven, SiLU-and-mul three, each a few microseconds
of dispatch for a few thousand values. These run as one C call each, reproducing the torch
chains' bfloat16 roundings. They serve bfloat16 on CPU only; float32 (the token-exact
reference path) and every other case keep the torch ops. PAGEDLLM_FUSED_OPS=torch switches
them off.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path
from typing import Any

import torch

from pagedllm.utils import native

_SOURCE = Path(__file__).with_name("csrc") / "cpu_ops.c"
_W4A8_SOURCE = Path(__file__).with_name("csrc") / "w4a8.c"
_I64, _F32, _I32 = ctypes.c_int64, ctypes.c_float, ctypes.c_int32


def _load(source: Path, restypes: dict[str, Any]) -> ctypes.CDLL | None:
    """`source` built and loaded with its functions' return types set, unless switched off."""
    if os.environ.get("PAGEDLLM_FUSED_OPS", "c") == "torch":
        return None
    library = native.load_library(source)
    if library is not None:
        for name, restype in restypes.items():
            getattr(library, name).restype = restype
    return library


@cache
def _library() -> ctypes.CDLL | None:
    names = ("add_rms_norm_bf16", "silu_and_mul_bf16", "rope_neox_bf16")
    return _load(_SOURCE, dict.fromkeys(names))


def fused_ops_available() -> bool:
    """True when the fused element-wise ops are built here and not switched off."""
    return _library() is not None


def serves(x: torch.Tensor) -> bool:
    """True when the fused ops can take this activation: 2-D bfloat16 on CPU, rows dense."""
    return (
        x.dtype == torch.bfloat16
        and x.device.type == "cpu"
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
    library = _library()
    assert library is not None
    num_tokens, hidden = x.shape
    has_residual = residual is not None
    if residual is None:
        residual = torch.empty(num_tokens, hidden, dtype=torch.float32)
    out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16)
    library.add_rms_norm_bf16(
        _I64(num_tokens), _I64(hidden), native.pointer(x), _I64(x.stride(0)),
        native.pointer(residual), _I32(has_residual), native.pointer(weight),
        native.pointer(out), _F32(eps),
    )
    return out, residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2d] (gate | up) bfloat16 → silu(gate) * up [T, d]."""
    library = _library()
    assert library is not None
    num_tokens, width = x.shape
    out = torch.empty(num_tokens, width // 2, dtype=torch.bfloat16)
    library.silu_and_mul_bf16(
        _I64(num_tokens), _I64(width // 2), native.pointer(x), _I64(x.stride(0)),
        native.pointer(out),
    )
    return out


def rope_neox_(
    x: torch.Tensor,  # [T, heads * head_size] bfloat16, rotated in place
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_position, rotary_dim] float32 (cos | sin)
    head_size: int,
) -> None:
    """Rotate every head of `x` in place by its token's position (neox pairing)."""
    library = _library()
    assert library is not None
    num_tokens, width = x.shape
    library.rope_neox_bf16(
        _I64(num_tokens), _I64(width // head_size), _I64(head_size),
        _I64(cos_sin_cache.shape[1]), native.pointer(x), _I64(x.stride(0)),
        native.pointer(positions), native.pointer(cos_sin_cache),
    )


@cache
def _w4a8_library() -> ctypes.CDLL | None:
    return _load(_W4A8_SOURCE, {"w4a8_matmul_bf16": ctypes.c_int, "w8a8_matmul_bf16": ctypes.c_int})


def w4a8_available() -> bool:
    """True when the int4 x int8 kernel is built here."""
    return _w4a8_library() is not None


def w4a8_matmul(
    x: torch.Tensor,  # [T, K] bfloat16, rows dense
    packed: torch.Tensor,  # [panels, K / 32, 256] uint8
    scales_and_mins: torch.Tensor,  # [panels, K / 32, 2, 16] float32
    out_features: int,
) -> torch.Tensor:  # [T, out_features] bfloat16
    """x @ W^T for W in the W4A8Weight layout; activations quantized per 32 values."""
    return _byte_dot_matmul("w4a8_matmul_bf16", x, packed, scales_and_mins, out_features)


def w8a8_matmul(
    x: torch.Tensor,  # [T, K] bfloat16, rows dense
    codes: torch.Tensor,  # [panels, K / 32, 512] uint8 (q + 128)
    scales: torch.Tensor,  # [panels, K / 32, 16] float32
    out_features: int,
) -> torch.Tensor:  # [T, out_features] bfloat16
    """x @ W^T for W in the W8A8Weight layout; activations quantized per 32 values."""
    return _byte_dot_matmul("w8a8_matmul_bf16", x, codes, scales, out_features)


def _byte_dot_matmul(
    function: str, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, out_features: int
) -> torch.Tensor:
    library = _w4a8_library()
    assert library is not None
    num_tokens, in_features = x.shape
    out = torch.empty(num_tokens, out_features, dtype=torch.bfloat16)
    if num_tokens == 0:
        return out
    failed = getattr(library, function)(
        _I64(num_tokens), _I64(out_features), _I64(in_features),
        native.pointer(x), _I64(x.stride(0)), native.pointer(codes), native.pointer(scales),
        native.pointer(out), _I64(out_features),
    )
    if failed:
        raise MemoryError(f"{function}: input size not a multiple of 32, or out of memory")
    return out
