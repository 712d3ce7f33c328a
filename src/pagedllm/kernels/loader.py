"""The CPU kernel library of this process: the plan's variant, built and loaded once.

Every Python wrapper of a C kernel (layers/cpu_ops.py, attention/cpu_kernel.py,
models/cpu_decode_stack.py) calls `library()`, whatever the ISA: the functions and their
signatures are the same in every variant (csrc/kernels.h). The first call logs the choice at
INFO ("CPU x86_64: avx2 fma; no avx512f ...: W4A8 on avx2 kernels"), or one WARNING when
no library can be had, naming what that costs. Tests load other variants with
`load_variant` and make one current with `use`.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pagedllm.kernels import build
from pagedllm.kernels.plan import cpu_plan
from pagedllm.kernels.variants import Variant, get_variant
from pagedllm.logger import init_logger

logger = init_logger(__name__)

# Functions that return an int status (0: success); the others return nothing.
_INT_FUNCTIONS = (
    "paged_decode_f32", "paged_decode_bf16", "paged_decode_f32_int8", "paged_decode_bf16_int8",
    "paged_prefill_f32", "paged_prefill_bf16", "paged_prefill_f32_int8",
    "paged_prefill_bf16_int8", "w4a8_matmul_bf16", "w8a8_matmul_bf16", "decode_stack_bf16",
    "lora_add_bf16",
)
_VOID_FUNCTIONS = (
    "store_int8_f32", "store_int8_bf16", "add_rms_norm_bf16", "silu_and_mul_bf16",
    "rope_neox_bf16",
)
_NO_KERNELS_COST = (
    "decode of quantized models several times slower, no int8 KV cache writer, attention "
    "on gathered dense copies"
)


@dataclass(frozen=True)
class KernelLibrary:
    """A loaded variant: its ctypes handle (`lib.function(...)`) and what it was built as."""

    lib: ctypes.CDLL
    variant: Variant
    path: Path

    @property
    def isa(self) -> str:
        """The variant name the library reports about itself (pagedllm_isa())."""
        return bytes(self.lib.pagedllm_isa()).decode()


def load_variant(name: str, compiler: str | None = None) -> KernelLibrary:
    """Build (if needed) and load the variant `name`; the caller checks the CPU runs it.

    Raises:
        ValueError: unknown variant; build.BuildError: it could not be built.
    """
    variant = get_variant(name)
    return open_library(build.build_variant(variant, compiler), variant)


def open_library(path: Path, variant: Variant) -> KernelLibrary:
    """Load a built library of `variant` and set its functions' return types.

    The library is built with -ffast-math, and gcc links start-up code with it that turns on
    flush-to-zero / denormals-are-zero in the loading thread: the caller's float math would
    change under it. The thread's previous mode is put back after the load.
    """
    flushed_before = _flushes_denormals()
    lib = ctypes.CDLL(str(path))
    if not flushed_before and _flushes_denormals():
        import torch

        torch.set_flush_denormal(False)
    for function in _INT_FUNCTIONS:
        getattr(lib, function).restype = ctypes.c_int
    for function in _VOID_FUNCTIONS:
        getattr(lib, function).restype = None
    lib.pagedllm_isa.restype = ctypes.c_char_p
    return KernelLibrary(lib, variant, path)


def _flushes_denormals() -> bool:
    """Whether this thread flushes subnormal floats to zero (FTZ/DAZ on)."""
    return sys.float_info.min / 2 == 0.0


_loaded = False
_current: KernelLibrary | None = None


def library() -> KernelLibrary | None:
    """The process's kernel library, or None when it cannot be had (logged once)."""
    global _loaded, _current
    if not _loaded:
        _loaded = True
        _current = _load_planned()
    return _current


def _load_planned() -> KernelLibrary | None:
    plan = cpu_plan()
    if plan.variant is None:
        logger.warning(
            "%s. The C kernels are not built, so torch's dense paths run instead (%s). "
            "Install gcc or clang (or set CC) to get them.", plan.reason, _NO_KERNELS_COST,
        )
        return None
    try:
        loaded = load_variant(plan.variant.name)
    except (build.BuildError, OSError) as exc:
        logger.warning(
            "The %s CPU kernels could not be built (%s); torch's dense paths run instead (%s).",
            plan.variant.name, exc, _NO_KERNELS_COST,
        )
        return None
    openmp = build.supports_openmp(build.find_compiler() or "cc")
    logger.info("%s%s.", plan.reason, "" if openmp else " (no OpenMP: one thread)")
    return loaded


@contextmanager
def use(kernels: KernelLibrary | None) -> Iterator[None]:
    """Make `kernels` (or no library) the current one inside the block (tests)."""
    global _loaded, _current
    saved = (_loaded, _current)
    _loaded, _current = True, kernels
    try:
        yield
    finally:
        _loaded, _current = saved


def pointer(tensor: object) -> ctypes.c_void_p:
    """A tensor's data pointer as a ctypes argument."""
    return ctypes.c_void_p(tensor.data_ptr())  # type: ignore[attr-defined]
