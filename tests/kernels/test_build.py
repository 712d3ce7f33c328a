"""Building and loading the kernel library: per-variant flags and cache names, clang, and the
one warning when no compiler is there."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from pagedllm import kernels
from pagedllm.kernels import build, loader
from pagedllm.kernels.variants import VARIANTS, best_variant, get_variant, runnable_variants
from pagedllm.layers.cpu_ops import w4a8_available
from pagedllm.layers.quantization import Bf16PanelWeight, quantize_w4a8
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu import CpuPlatform
from pagedllm.platform.cpu_features import CpuFeatures, detect
from pagedllm.platform.cpu_plan import plan_for

needs_compiler = pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")


def test_each_variant_has_its_own_flags_and_never_march_native():
    command = build.compile_command(get_variant("avx2"), "cc", build.CSRC / "x.so", True, "Linux")
    assert "-mavx2" in command and "-mfma" in command and "-fopenmp" in command
    assert not any(flag.startswith(("-march=native", "-mavx512")) for flag in command)
    assert "-mprefer-vector-width=512" not in command  # Arm's compilers reject it
    assert command[-1] == "-lm" and str(build.CSRC / "avx2.c") in command
    neon = build.compile_command(get_variant("neon_dotprod"), "cc", build.CSRC / "x.so", False)
    assert "-march=armv8.2-a+dotprod" in neon and "-fopenmp" not in neon


def test_an_extending_variant_keeps_its_bases_source_flags_and_features():
    """What `extends` promises the tests that run only the base variant (amx_bf16 adds AMX's
    flags to avx512_bf16's)."""
    extending = [v for v in VARIANTS if v.extends is not None]
    assert [v.name for v in extending] == ["amx_bf16"]
    for variant in extending:
        base = get_variant(variant.extends)
        assert variant.source == base.source and variant.simd == base.simd
        assert set(base.flags) <= set(variant.flags) and base.requires <= variant.requires


def test_macos_builds_a_dylib_without_openmp():
    command = build.compile_command(get_variant("neon"), "clang", build.CSRC / "x", False, "Darwin")
    assert "-dynamiclib" in command and "-shared" not in command and "-fopenmp" not in command
    assert build.library_suffix("Darwin") == ".dylib" and build.library_suffix("Linux") == ".so"


@needs_compiler
def test_cache_file_names_the_variant(tmp_path):
    path = build.build_variant(get_variant("scalar"), cache_dir=tmp_path)
    assert path.name.startswith("pagedllm-scalar-") and path.parent == tmp_path
    assert build.build_variant(get_variant("scalar"), cache_dir=tmp_path) == path  # cached


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed")
@pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
def test_clang_builds_the_same_arithmetic(tmp_path):
    variant = best_variant(detect())
    built = build.build_variant(variant, compiler=shutil.which("clang"), cache_dir=tmp_path)
    clang = loader.open_library(built, variant)
    assert clang.isa == variant.name
    if not variant.simd or not w4a8_available():
        return  # no W4A8 here (e.g. PAGEDLLM_CPU_ISA=scalar forces the scalar plan)
    weight = quantize_w4a8(torch.randn(80, 192).bfloat16())
    panels = Bf16PanelWeight.from_weight(torch.randn(80, 192).bfloat16())  # AMX's tiles too
    x = torch.randn(9, 192).bfloat16()
    with cpu_platform().use_kernels(clang):
        from_clang = weight.matmul(x), panels.apply(x, None)
    with cpu_platform().use_kernels(kernels.load_variant(variant.name)):
        from_gcc = weight.matmul(x), panels.apply(x, None)
    assert all(map(torch.equal, from_clang, from_gcc))


class _Records(logging.Handler):
    """Collects the package logger's records (pagedllm's logger does not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def package_log():
    handler = _Records()
    logging.getLogger("pagedllm").addHandler(handler)
    yield handler.records
    logging.getLogger("pagedllm").removeHandler(handler)


def test_no_compiler_means_torch_paths_and_one_warning(monkeypatch, package_log):
    plan = plan_for(CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"})), False)
    monkeypatch.setattr(CpuPlatform, "plan", plan)
    assert CpuPlatform()._load_planned() is None
    warnings = [r.getMessage() for r in package_log if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(package_log) == 1
    assert "no C compiler" in warnings[0] and "several times slower" in warnings[0]


def test_a_failed_build_falls_back_with_a_warning(monkeypatch, package_log):
    def refuse(*args, **kwargs):
        raise build.BuildError("avx2: error: unknown flag")

    monkeypatch.setattr(build, "build_variant", refuse)
    plan = plan_for(CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"})), True)
    monkeypatch.setattr(CpuPlatform, "plan", plan)
    assert CpuPlatform()._load_planned() is None
    # A warning per variant tried (avx2, then the ones below it), then what runs instead.
    assert {r.levelno for r in package_log} == {logging.WARNING}
    assert "avx2 CPU kernels could not be built" in package_log[0].getMessage()
    assert "torch's dense paths run instead" in package_log[-1].getMessage()


@needs_compiler
def test_a_variant_the_compiler_refuses_falls_back_to_the_next(monkeypatch, package_log):
    """gcc < 10 knows no -mavx512bf16: the next variant this CPU runs is built instead."""
    real = build.build_variant
    planned = runnable_variants(detect())[0]

    def refuse_the_first(variant, *args, **kwargs):
        if variant.name == planned.name:
            raise build.BuildError(f"{variant.name}: error: unknown flag")
        return real(variant, *args, **kwargs)

    monkeypatch.setattr(build, "build_variant", refuse_the_first)
    monkeypatch.delenv("PAGEDLLM_CPU_ISA", raising=False)
    monkeypatch.setattr(CpuPlatform, "plan", plan_for(detect(), True))
    loaded = CpuPlatform()._load_planned()
    assert loaded is not None and loaded.isa == runnable_variants(detect())[1].name
    assert [r.levelno for r in package_log] == [logging.WARNING, logging.INFO]
    assert "instead" in package_log[1].getMessage()


@needs_compiler
def test_the_choice_is_logged_once_at_info(monkeypatch, package_log):
    plan = plan_for(CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"})), True)
    monkeypatch.setattr(CpuPlatform, "plan", plan)
    loaded = CpuPlatform()._load_planned()
    assert loaded is not None and loaded.isa == "avx2"
    assert [r.levelno for r in package_log] == [logging.INFO]
    assert "W4A8 on avx2 kernels" in package_log[0].getMessage()


def test_forced_variant_is_loaded(monkeypatch):
    monkeypatch.setenv("PAGEDLLM_CPU_ISA", "scalar")
    from pagedllm.platform.cpu_plan import cpu_plan

    cpu_plan.cache_clear()
    try:
        plan = cpu_plan()
        assert plan.variant is not None and plan.variant.name == "scalar"
        assert not plan.byte_dot_kernels and "forced by PAGEDLLM_CPU_ISA" in plan.reason
    finally:
        monkeypatch.delenv("PAGEDLLM_CPU_ISA")
        cpu_plan.cache_clear()
