"""Which CPU paths the engine takes on this machine, decided from its features once.

The plan answers three questions, each from capabilities, so that no path is picked that is
slower than torch's own on the same CPU:
  - which kernel variant to load (the best the CPU runs, or PAGEDLLM_CPU_ISA's), if any: no
    C compiler means torch ops everywhere;
  - whether int4/int8 weights of bfloat16 models run as W4A8/W8A8 on the C kernels: only
    with a vector variant (the scalar reference is far slower than torch's int4 kernel and
    dense matmuls);
  - whether bfloat16 dense matmuls are native: only then does `dtype="auto"` choose bfloat16
    for dense weights and does oneDNN's packed bf16 layout get used. Without native bf16
    (AVX2, most Arm) torch emulates bf16 matmuls, about 3x slower than float32.
`plan_for` is a pure function of the features, so the plan of any CPU can be tested here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from pagedllm import envs
from pagedllm.kernels import build
from pagedllm.kernels.variants import Variant, best_variant, get_variant
from pagedllm.platform.cpu_features import CpuFeatures, detect

# Features that make bfloat16 matmuls native (x86: AVX-512 BF16 or AMX; Arm: the BF16
# extension).
_NATIVE_BF16 = {"x86_64": ("avx512_bf16", "amx_bf16"), "aarch64": ("bf16",)}
# Features named in the plan's reason, when relevant to the choice, per architecture.
_REPORTED = {
    "x86_64": ("avx2", "fma", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"),
    "aarch64": ("asimd", "asimddp", "bf16"),
}


@dataclass(frozen=True)
class CpuPlan:
    """The CPU paths chosen for a feature set.

    Attributes:
        variant: the kernel variant to load, or None (no C compiler: torch ops only).
        byte_dot_kernels: int4/int8 weights of bfloat16 models run as W4A8/W8A8 in C.
        native_bf16: bfloat16 matmuls run in hardware (dense bf16, oneDNN packing).
        reason: one line saying what was found and what follows, for the log.
    """

    variant: Variant | None
    byte_dot_kernels: bool
    native_bf16: bool
    reason: str


def has_native_bf16(features: CpuFeatures) -> bool:
    """True when the CPU multiplies bfloat16 in hardware."""
    return any(flag in features.flags for flag in _NATIVE_BF16.get(features.arch, ()))


def _describe(features: CpuFeatures) -> str:
    reported = _REPORTED.get(features.arch, ())
    present = [f for f in reported if f in features.flags]
    absent = [f for f in reported if f not in features.flags]
    text = f"CPU {features.arch}: {' '.join(present) or 'no vector extensions found'}"
    return text + (f"; no {' '.join(absent)}" if absent else "")


def plan_for(
    features: CpuFeatures,
    compiler_available: bool,
    forced: str | None = None,
    torch_bf16_matmul: bool = True,
) -> CpuPlan:
    """The plan for a CPU with `features`; `torch_bf16_matmul` False when torch's oneDNN
    says it cannot run bf16 matmuls here (it may be limited below the CPU, e.g. by
    ONEDNN_MAX_CPU_ISA), which rules native bf16 out too.

    Raises:
        ValueError: when `forced` names an unknown variant or one this CPU cannot execute.
    """
    native_bf16 = has_native_bf16(features) and torch_bf16_matmul
    bf16_note = "bf16 matmuls native" if native_bf16 else "bf16 matmuls emulated: dense float32"
    if not compiler_available:
        return CpuPlan(
            None, False, native_bf16,
            f"{_describe(features)}: no C compiler, torch ops only; {bf16_note}",
        )
    if forced is not None:
        variant = get_variant(forced)
        if not variant.runs_on(features):
            missing = sorted(variant.requires - features.flags)
            raise ValueError(
                f"PAGEDLLM_CPU_ISA={forced} cannot run on this CPU ({features.arch}"
                f"{', lacking ' + ' '.join(missing) if missing else ''})."
            )
        chosen = f"{variant.name} kernels (forced by PAGEDLLM_CPU_ISA)"
    else:
        variant = best_variant(features)
        chosen = f"{variant.name} kernels"
    weights = "W4A8" if variant.simd else "torch int4/int8 weights (scalar W4A8 would be slower)"
    return CpuPlan(
        variant, variant.simd, native_bf16,
        f"{_describe(features)}: {weights} on {chosen}; {bf16_note}",
    )


@cache
def cpu_plan() -> CpuPlan:
    """This machine's plan (decided once per process; PAGEDLLM_CPU_ISA read then)."""
    return plan_for(
        detect(), build.find_compiler() is not None, envs.cpu_isa(), _torch_bf16_matmul()
    )


def _torch_bf16_matmul() -> bool:
    """Whether torch's oneDNN runs bfloat16 matmuls on this CPU (at its configured ISA)."""
    try:
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (ImportError, AttributeError, RuntimeError):
        return True  # no opinion from torch: the CPU's features decide
