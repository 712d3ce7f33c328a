"""Loading a kernel variant's library: build it if needed, open it, declare its functions.

Which variant a process uses is the platform's choice (platform/cpu.py loads it once and
hands it to every wrapper); the functions and their signatures are the same in every
variant (csrc/kernels.h, declared for ctypes in abi.py). Tests load other variants with
`load_variant` and make one current with the CPU platform's `use_kernels`.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

from pagedllm.kernels import abi, build
from pagedllm.kernels.variants import Variant, get_variant


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
    """Load a built library of `variant` and declare its functions' types (abi.py).

    The library is built with -ffast-math, and gcc links start-up code with it that turns on
    flush-to-zero / denormals-are-zero in the loading thread: the caller's float math would
    change under it. The thread's previous mode is put back after the load.
    """
    flushed_before = _flushes_denormals()
    lib = ctypes.CDLL(str(path))
    if not flushed_before and _flushes_denormals():
        import torch

        torch.set_flush_denormal(False)
    abi.declare(lib)
    return KernelLibrary(lib, variant, path)


def _flushes_denormals() -> bool:
    """Whether this thread flushes subnormal floats to zero (FTZ/DAZ on)."""
    return sys.float_info.min / 2 == 0.0


def pointer(tensor: object) -> ctypes.c_void_p:
    """A tensor's data pointer as a ctypes argument."""
    return ctypes.c_void_p(tensor.data_ptr())  # type: ignore[attr-defined]
