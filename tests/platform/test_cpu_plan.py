"""The CPU plan for a table of feature sets, and reading the features (no such CPU needed)."""

from __future__ import annotations

import pytest

from pagedllm.kernels.variants import VARIANT_NAMES, best_variant, get_variant
from pagedllm.platform.cpu_features import CpuFeatures, detect, normalise_arch, parse_cpuinfo
from pagedllm.platform.cpu_plan import plan_for

AVX512 = "fpu sse sse2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_vnni"
# (name, arch, flags, compiler found) -> (variant, W4A8 on the C kernels, native bf16)
PLANS = [
    ("avx512+vnni+bf16", "x86_64", f"{AVX512} avx512_bf16", True,
     ("avx512_bf16", True, True)),
    ("avx512+vnni+amx", "x86_64", f"{AVX512} amx_bf16 amx_int8", True, ("avx512", True, True)),
    ("avx512+vnni+bf16+amx", "x86_64", f"{AVX512} avx512_bf16 amx_tile amx_bf16 amx_int8", True,
     ("amx_bf16", True, True)),
    ("avx512+vnni", "x86_64", AVX512, True, ("avx512", True, False)),
    ("avx512 without vnni", "x86_64", "avx2 fma f16c avx512f avx512dq avx512bw avx512vl",
     True, ("avx2", True, False)),
    ("avx2+fma", "x86_64", "sse2 avx avx2 fma f16c", True, ("avx2", True, False)),
    ("avx2+avx_vnni", "x86_64", "avx2 fma f16c avx_vnni", True, ("avx2_vnni", True, False)),
    ("neon+dotprod", "aarch64", "fp asimd asimddp", True, ("neon_dotprod", True, False)),
    ("neon+dotprod+bf16", "aarch64", "fp asimd asimddp bf16", True, ("neon_dotprod", True, True)),
    ("neon", "aarch64", "fp asimd", True, ("neon", True, False)),
    ("none (x86-64 baseline)", "x86_64", "fpu sse sse2", True, ("scalar", False, False)),
    ("riscv64", "riscv64", "", True, ("scalar", False, False)),
    ("avx2, no compiler", "x86_64", "avx2 fma f16c", False, (None, False, False)),
]


@pytest.mark.parametrize(("arch", "flags", "compiler", "want"),
                         [p[1:] for p in PLANS], ids=[p[0] for p in PLANS])
def test_plan_for_feature_sets(arch, flags, compiler, want):
    plan = plan_for(CpuFeatures(arch, frozenset(flags.split())), compiler)
    variant, byte_dots, native_bf16 = want
    assert (plan.variant.name if plan.variant else None) == variant
    assert plan.byte_dot_kernels is byte_dots
    assert plan.native_bf16 is native_bf16
    assert plan.reason.startswith(f"CPU {arch}")
    if variant is None:
        assert "no C compiler" in plan.reason


def test_reason_names_what_is_missing():
    plan = plan_for(CpuFeatures("x86_64", frozenset(["avx2", "fma", "f16c"])), True)
    assert plan.reason == (
        "CPU x86_64: avx2 fma; no avx_vnni avx512f avx512_vnni avx512_bf16 amx_bf16: "
        "W4A8 on avx2 kernels; bf16 matmuls emulated: dense float32"
    )


def test_forcing_a_variant():
    features = CpuFeatures("x86_64", frozenset(f"{AVX512} avx_vnni".split()))
    assert plan_for(features, True, "avx2").variant == get_variant("avx2")
    scalar = plan_for(features, True, "scalar")
    assert scalar.variant == get_variant("scalar") and not scalar.byte_dot_kernels
    with pytest.raises(ValueError, match="lacking asimd asimddp"):
        plan_for(features, True, "neon_dotprod")
    with pytest.raises(ValueError, match="avx2_vnni"):
        plan_for(features, True, "avx3")


def test_cpuinfo_is_parsed_per_architecture():
    x86 = "processor\t: 0\nflags\t\t: fpu avx2 fma\nbugs\t\t: spectre\nflags\t: other\n"
    assert parse_cpuinfo(x86, "x86_64") == {"fpu", "avx2", "fma"}
    # Arm's /proc/cpuinfo has no "flags" line: "Features" lists the extensions.
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm asimddp\n"
    assert parse_cpuinfo(arm, "aarch64") == {"fp", "asimd", "evtstrm", "asimddp"}
    assert parse_cpuinfo(arm, "x86_64") == frozenset()
    assert normalise_arch("AMD64") == "x86_64" and normalise_arch("arm64") == "aarch64"


def test_every_arch_has_a_variant_and_names_are_unique():
    assert len(set(VARIANT_NAMES)) == len(VARIANT_NAMES)
    for arch in ("x86_64", "aarch64", "ppc64le"):
        assert best_variant(CpuFeatures(arch, frozenset())).name == "scalar"


def test_this_host_is_read():
    features = detect()
    assert features.arch == normalise_arch(__import__("platform").machine())
    if features.arch == "x86_64" and features.source == "/proc/cpuinfo":
        assert "sse2" in features.flags
