"""The CPU's instruction-set features, read once: what the kernel variants are chosen from.

Linux lists them in /proc/cpuinfo ("flags" on x86, "Features" on Arm, the kernel's names:
avx2, avx512_vnni, avx_vnni, asimddp, ...); macOS answers through sysctl; elsewhere torch's
own capability string is the fallback. Names are always the Linux kernel's, lowercase.
Reads files and runs sysctl only; it builds and loads nothing.
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass
from functools import cache

_ARCH_NAMES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}
# macOS sysctl names (x86 Macs: machdep.cpu.*features; Apple Silicon: hw.optional.arm.FEAT_*).
_MACOS_X86_NAMES = {
    "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "AVX512F": "avx512f", "AVX512BW": "avx512bw",
    "AVX512VL": "avx512vl", "AVX512DQ": "avx512dq", "AVX512VNNI": "avx512_vnni",
    "AVX512BF16": "avx512_bf16",
}
_MACOS_ARM_NAMES = {"FEAT_DotProd": "asimddp", "FEAT_BF16": "bf16", "FEAT_I8MM": "i8mm"}
# What torch's capability string implies, when nothing better can be read.
_TORCH_CAPABILITY_FLAGS = {
    "AVX2": {"avx2", "fma", "f16c"},
    "AVX512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"},
}


@dataclass(frozen=True)
class CpuFeatures:
    """An architecture ("x86_64", "aarch64", or the machine name) and its feature flags.

    Attributes:
        arch: normalised machine architecture.
        flags: feature names, lowercase, as Linux's /proc/cpuinfo spells them.
        source: where they were read ("/proc/cpuinfo", "sysctl", "torch" or "none").
    """

    arch: str
    flags: frozenset[str]
    source: str = "given"

    def has(self, *names: str) -> bool:
        """True when every name is among the flags."""
        return all(name in self.flags for name in names)


def normalise_arch(machine: str) -> str:
    """platform.machine()'s answer as "x86_64" / "aarch64" (other names pass through)."""
    return _ARCH_NAMES.get(machine.lower(), machine.lower())


def parse_cpuinfo(text: str, arch: str) -> frozenset[str]:
    """The feature flags of the first CPU in /proc/cpuinfo's text ("flags" on x86, "Features"
    on Arm); empty when neither line is there."""
    key = "flags" if arch == "x86_64" else "features"
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == key:
            return frozenset(value.split())
    return frozenset()


def _read_proc_cpuinfo(arch: str) -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read(), arch)
    except OSError:
        return frozenset()


def _sysctl(name: str) -> str:
    try:
        result = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def _read_macos(arch: str) -> frozenset[str]:
    if arch == "aarch64":
        flags = {"asimd"}  # NEON is part of every AArch64 CPU
        flags.update(
            linux for feat, linux in _MACOS_ARM_NAMES.items()
            if _sysctl(f"hw.optional.arm.{feat}") == "1"
        )
        return frozenset(flags)
    words = (_sysctl("machdep.cpu.features") + " " + _sysctl("machdep.cpu.leaf7_features")).split()
    return frozenset(_MACOS_X86_NAMES[w] for w in words if w in _MACOS_X86_NAMES)


def _read_torch(arch: str) -> frozenset[str]:
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError, RuntimeError):
        return frozenset()
    flags = set(_TORCH_CAPABILITY_FLAGS.get(capability, set()))
    if arch == "aarch64":
        flags.add("asimd")
    return frozenset(flags)


@cache
def detect() -> CpuFeatures:
    """This machine's features (read once per process)."""
    arch = normalise_arch(platform.machine())
    system = platform.system()
    if system == "Linux":
        flags = _read_proc_cpuinfo(arch)
        if flags:
            return CpuFeatures(arch, flags, "/proc/cpuinfo")
    elif system == "Darwin":
        flags = _read_macos(arch)
        if flags:
            return CpuFeatures(arch, flags, "sysctl")
    flags = _read_torch(arch)
    return CpuFeatures(arch, flags, "torch" if flags else "none")
