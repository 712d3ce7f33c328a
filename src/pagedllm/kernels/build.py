"""Compile a kernel variant's library with the system C compiler, once, into a cache.

The library of a variant is the common sources plus its ISA source, compiled with the
variant's own flags (variants.py) into `$PAGEDLLM_CACHE_DIR/kernels`, under a name holding
the variant and a hash of the sources, headers, flags and compiler. gcc and clang both
work; Linux builds a `.so`, macOS a `.dylib`. OpenMP threads the kernels where the compiler
has it (`-fopenmp`; Apple's clang has none by default): without it the same code compiles
and runs on one thread. A cross compiler (e.g. aarch64-linux-gnu-gcc) builds another
architecture's variants for tests under qemu. Loads nothing.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from pagedllm import envs
from pagedllm.kernels.variants import Variant

CSRC = Path(__file__).with_name("csrc")
# The sources every variant shares; its ISA source (isa.h's primitives) is added to them.
COMMON_SOURCES = (
    "w4a8.c", "paged_attention.c", "cpu_ops.c", "lora.c", "decode_stack.c", "moe.c",
    "lm_head.c", "decode_loop.c", "bf16_matmul.c", "amx_bf16.c", "amx_attention.c",
    "dense_attention.c",
)
# -ffast-math lets the compiler vectorize the float reductions of the common sources; the
# arithmetic that must be equal on every ISA is written with explicit fused multiply-adds
# (isa.h). Hidden visibility keeps two variants loaded in one process apart.
COMMON_FLAGS = ("-O3", "-ffast-math", "-fPIC", "-fvisibility=hidden", "-Wno-unknown-pragmas")
_OPENMP_PROBE = "#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n"


class BuildError(RuntimeError):
    """The compiler refused a variant; the message holds its error output."""


def find_compiler() -> str | None:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH; None when there is none."""
    named = envs.c_compiler()
    if named:
        return shutil.which(named) or (named if os.path.exists(named) else None)
    for candidate in ("cc", "gcc", "clang"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


@cache
def compiler_identity(compiler: str) -> str:
    """The compiler's version line (part of the cache key: another compiler, another build)."""
    try:
        result = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return compiler
    lines = result.stdout.splitlines()
    return f"{compiler} {lines[0] if lines else ''}"


@cache
def supports_openmp(compiler: str) -> bool:
    """True when `compiler` builds and links an OpenMP program with -fopenmp."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.c"
        source.write_text(_OPENMP_PROBE)
        try:
            result = subprocess.run(
                [compiler, "-fopenmp", str(source), "-o", str(Path(tmp) / "probe")],
                capture_output=True, timeout=60, check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0


def library_suffix(system: str | None = None) -> str:
    """The shared-library file suffix of the operating system."""
    return ".dylib" if (system or platform.system()) == "Darwin" else ".so"


def compile_command(
    variant: Variant, compiler: str, output: Path, openmp: bool, system: str | None = None
) -> list[str]:
    """The full command that builds `variant` into `output`."""
    link = ["-dynamiclib"] if (system or platform.system()) == "Darwin" else ["-shared"]
    sources = [str(CSRC / name) for name in (*COMMON_SOURCES, variant.source)]
    return [
        compiler, *COMMON_FLAGS, *variant.flags, *(["-fopenmp"] if openmp else []), *link,
        f"-I{CSRC}", "-o", str(output), *sources, "-lm",
    ]


def _cache_key(variant: Variant, compiler: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(CSRC.glob("*.[ch]")):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join((*COMMON_FLAGS, *variant.flags)).encode())
    digest.update(compiler_identity(compiler).encode())
    return digest.hexdigest()[:16]


def kernel_cache_dir() -> Path:
    """Where built libraries are kept."""
    return Path(envs.cache_dir()) / "kernels"


def build_variant(
    variant: Variant, compiler: str | None = None, cache_dir: Path | None = None
) -> Path:
    """Build `variant` (once per sources, flags and compiler) and return the library's path.

    Raises:
        BuildError: no compiler, or the compiler failed (its output in the message).
    """
    compiler = compiler or find_compiler()
    if compiler is None:
        raise BuildError("no C compiler found (set CC, or install gcc or clang)")
    folder = cache_dir or kernel_cache_dir()
    target = folder / f"pagedllm-{variant.name}-{_cache_key(variant, compiler)}{library_suffix()}"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builders never see a partial file.
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        built = Path(tmp) / target.name
        command = compile_command(variant, compiler, built, supports_openmp(compiler))
        try:
            result = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise BuildError(f"{compiler}: {exc}") from exc
        if result.returncode != 0:
            raise BuildError(f"{variant.name}: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)
    return target
