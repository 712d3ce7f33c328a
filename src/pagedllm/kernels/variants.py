"""The kernel variants: one per instruction set, each with its ISA source, its compiler flags
and the CPU features it needs, and the choice of the best one a CPU can run.

A variant's library is the common C sources plus its ISA source (csrc/isa.h), compiled with
its own flags: never `-march=native`, so a library built on one machine is valid on every
CPU with the variant's features (a Docker image can carry them all). Pure data and pure
functions: nothing is built or loaded here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the platform reads the CPU; this leaf only matches variants to it
    from pagedllm.platform.cpu_features import CpuFeatures

_X86_BASE = ("-mavx2", "-mfma", "-mf16c")


@dataclass(frozen=True)
class Variant:
    """One build of the kernel library.

    Attributes:
        name: what PAGEDLLM_CPU_ISA and the logs call it.
        arch: the architecture it is built for ("any" for the portable scalar reference).
        source: its ISA source in csrc/.
        requires: CPU features (Linux names) it executes.
        flags: its compiler flags (beyond the common ones).
        simd: True when its byte dot products are vector code; the scalar reference's are
            slower than torch's own quantized and dense paths, so the engine never picks
            W4A8 on it.
        extends: the variant whose source and flags this one adds to (None: its own), so
            everything but what it adds computes as there (tests of the shared kernels run
            the base variant only).
    """

    name: str
    arch: str
    source: str
    requires: frozenset[str]
    flags: tuple[str, ...]
    simd: bool = True
    extends: str | None = None

    def runs_on(self, features: CpuFeatures) -> bool:
        """True when a CPU with `features` can execute this variant's instructions."""
        return self.arch in ("any", features.arch) and features.has(*self.requires)


_AVX512 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                     "avx512_vnni"})
_AVX512_FLAGS = (
    *_X86_BASE, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni",
    # gcc prefers 256-bit vectors on AVX-512 CPUs; the dot products gain ~10% at 512.
    "-mprefer-vector-width=512",
)

# Best first: the first one a CPU runs is the one it gets.
VARIANTS: tuple[Variant, ...] = (
    # avx512_bf16 with dense bfloat16 matmuls on AMX's tiles (csrc/amx_bf16.c): 2-4x torch's
    # linear at 1-32 tokens, 0.8-0.95x oneDNN's packed matmul at 512 (BENCHMARKS.md). Their
    # arithmetic is the matrix unit's, not vdpbf16ps's; so is the prefill attention of
    # bfloat16 queries (csrc/amx_attention.c); everything else is avx512_bf16's.
    Variant("amx_bf16", "x86_64", "avx512.c", _AVX512 | {"avx512_bf16", "amx_tile", "amx_bf16"},
            (*_AVX512_FLAGS, "-mavx512bf16", "-mamx-tile", "-mamx-bf16"), extends="avx512_bf16"),
    # The same source with vdpbf16ps for dense bfloat16 weights (bit-identical to avx512's
    # emulation of it, about twice as fast).
    Variant("avx512_bf16", "x86_64", "avx512.c", _AVX512 | {"avx512_bf16"},
            (*_AVX512_FLAGS, "-mavx512bf16")),
    Variant("avx512", "x86_64", "avx512.c", _AVX512, _AVX512_FLAGS),
    Variant(
        "avx2_vnni", "x86_64", "avx2.c", frozenset({"avx2", "fma", "f16c", "avx_vnni"}),
        (*_X86_BASE, "-mavxvnni"),
    ),
    Variant("avx2", "x86_64", "avx2.c", frozenset({"avx2", "fma", "f16c"}), _X86_BASE),
    Variant(
        "neon_dotprod", "aarch64", "neon.c", frozenset({"asimd", "asimddp"}),
        ("-march=armv8.2-a+dotprod",),
    ),
    Variant("neon", "aarch64", "neon.c", frozenset({"asimd"}), ("-march=armv8-a",)),
    Variant("scalar", "any", "scalar.c", frozenset(), (), simd=False),
)
VARIANT_NAMES = tuple(v.name for v in VARIANTS)


def get_variant(name: str) -> Variant:
    """The variant called `name`.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    for variant in VARIANTS:
        if variant.name == name:
            return variant
    raise ValueError(
        f"Unknown CPU kernel variant {name!r}; choose one of {', '.join(VARIANT_NAMES)}."
    )


def runnable_variants(features: CpuFeatures) -> list[Variant]:
    """Every variant a CPU with `features` can execute, best first (scalar is always last)."""
    return [v for v in VARIANTS if v.runs_on(features)]


def best_variant(features: CpuFeatures) -> Variant:
    """The fastest variant a CPU with `features` can execute."""
    return runnable_variants(features)[0]


def variants_for_arch(arch: str) -> list[Variant]:
    """Every variant that can be built for `arch` (e.g. all of them into a Docker image)."""
    return [v for v in VARIANTS if v.arch in ("any", arch)]
