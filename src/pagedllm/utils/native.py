"""Build and load the engine's C sources for this CPU (compiled once, cached per user).

A source is compiled with the system C compiler for the machine it runs on
(`-march=native`) into `$PAGEDLLM_CACHE_DIR` (default `~/.cache/pagedllm/kernels`), keyed by
the source, the flags and the CPU's feature flags, and loaded with ctypes (which releases
the GIL during calls). Without a compiler the caller falls back to torch ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from pagedllm.logger import init_logger

logger = init_logger(__name__)

# 512-bit vectors: gcc prefers 256-bit ones on AVX-512 CPUs; the dot products gain ~10%.
FLAGS = [
    "-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp",
    "-shared", "-fPIC",
]


def _cache_dir() -> Path:
    root = os.environ.get("PAGEDLLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pagedllm"
    )
    return Path(root) / "kernels"


def _cpu_flags() -> str:
    """The CPU's feature flags: a library built with -march=native is only valid there."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


# Headers shared by the sources (bf16.h), on the include path of every build.
_INCLUDE = Path(__file__).with_name("csrc")


def _build(compiler: str, sources: tuple[Path, ...]) -> Path:
    """Compile `sources` into one library (once per sources, headers, flags and CPU); return
    the library's path."""
    texts = b"".join(source.read_bytes() for source in sources)
    headers = b"".join(h.read_bytes() for h in sorted(_INCLUDE.glob("*.h")))
    key = hashlib.sha256(
        texts + headers + " ".join(FLAGS).encode() + _cpu_flags().encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"{sources[0].stem}_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builders never see a partial file.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run(
            [compiler, *FLAGS, f"-I{_INCLUDE}", "-o", str(built), *map(str, sources), "-lm"],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(built, target)
    return target


def load_library(source: Path, *more_sources: Path) -> ctypes.CDLL | None:
    """`source` (linked with `more_sources`, whose functions it calls) compiled and loaded,
    or None when it cannot be built here (logged)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None or platform.system() != "Linux":
        logger.info("No C compiler found: %s is not used; torch ops run instead.", source.name)
        return None
    try:
        return ctypes.CDLL(str(_build(compiler, (source, *more_sources))))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        logger.warning("%s not built (%s); torch ops run instead.", source.name, detail)
        return None


def pointer(tensor: object) -> ctypes.c_void_p:
    """A tensor's data pointer as a ctypes argument."""
    return ctypes.c_void_p(tensor.data_ptr())  # type: ignore[attr-defined]


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim); False without glibc.

    Memory freed by malloc stays in its free lists, counted in this process's resident
    size, unless it sits at the top of the heap. After loading, that is the dense weights
    just replaced by quantized ones (tens of MB on the default model, measured).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
