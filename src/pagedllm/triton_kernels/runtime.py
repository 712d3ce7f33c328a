"""When Triton kernels can run, and their lazy compilation.

Triton decides at decoration time whether `@triton.jit` compiles for the GPU or wraps the
function for its CPU interpreter (`TRITON_INTERPRET`). Kernels here are plain functions
jitted on first use, so importing a kernel module decides nothing. Triton's own library
functions (`tl.zeros`, `tl.max`, ...) are decorated when triton is first imported, though,
and an interpreted kernel cannot call compiled ones: a process picks one mode, before
anything imports triton (tests/conftest.py picks the interpreter for the CPU suite). Only
the kernel modules import Triton, and the engine imports them only where a kernel runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pagedllm.platform.triton import triton_interpreting as interpreting

_jitted: dict[tuple[Callable[..., Any], bool], Any] = {}


def upcast_dot(dtype: torch.dtype) -> bool:
    """Whether kernels should convert 16-bit `tl.dot` operands to float32 first: only in the
    interpreter, whose dot multiplies bfloat16 values as their raw 16-bit integers (Triton
    3.x stores them as uint16 for numpy). The GPU's bf16 x bf16 products are exact in its
    float32 accumulator, so the upcast dot computes the same sums."""
    return interpreting() and dtype in (torch.bfloat16, torch.float16)


def round_bf16_in_software(dtype: torch.dtype) -> bool:
    """Whether kernels should round float32 to bfloat16 themselves before casting: only in
    the interpreter, whose cast truncates (the GPU's rounds to nearest even). Adding half a
    unit (ties to even) to the float32 bits makes the truncation round to nearest."""
    return interpreting() and dtype == torch.bfloat16


def jit_kernel(fn: Callable[..., Any]) -> Any:
    """`triton.jit(fn)`, made once per mode (compiled or interpreted)."""
    key = (fn, interpreting())
    if key not in _jitted:
        import triton

        _jitted[key] = triton.jit(fn)
    return _jitted[key]
