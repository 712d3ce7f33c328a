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

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

_jitted: dict[tuple[Callable[..., Any], bool], Any] = {}


@functools.cache
def triton_available() -> bool:
    """True when the `triton` package is installed (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when TRITON_INTERPRET asks Triton to run kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


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


def runs_on(device: torch.device | str) -> bool:
    """Whether Triton kernels can run on tensors of `device`: compiled on CUDA, or in the
    interpreter on CPU when TRITON_INTERPRET is set."""
    device_type = torch.device(device).type
    if not triton_available():
        return False
    if device_type == "cuda":
        return True
    return device_type == "cpu" and interpreting()


def jit_kernel(fn: Callable[..., Any]) -> Any:
    """`triton.jit(fn)`, made once per mode (compiled or interpreted)."""
    key = (fn, interpreting())
    if key not in _jitted:
        import triton

        _jitted[key] = triton.jit(fn)
    return _jitted[key]
