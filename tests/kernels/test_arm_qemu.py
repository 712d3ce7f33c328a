"""The Arm variants, cross-compiled and run under qemu-aarch64 against the scalar reference.

No Arm machine is needed: Debian's gcc-aarch64-linux-gnu builds the neon and neon_dotprod
libraries and the scalar one with the same flags the engine would use on Arm, and the C
harness (harness.c, no torch) runs under qemu-user, which emulates the dot-product
extension (-cpu max). The same harness first runs natively on this host's best variant, so
a harness that could not tell a wrong kernel from a right one would show here too.
Skipped, with the reason, where the tools are absent; `.ci/run` installs them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pagedllm.kernels import build
from pagedllm.kernels.variants import best_variant, get_variant
from pagedllm.platform.cpu_features import detect

HARNESS = Path(__file__).with_name("harness.c")
CROSS_CC = "aarch64-linux-gnu-gcc"
SYSROOT = "/usr/aarch64-linux-gnu"


def _compile_harness(compiler: str, output: Path) -> None:
    subprocess.run(
        [compiler, "-O1", f"-I{build.CSRC}", "-o", str(output), str(HARNESS), "-ldl", "-lm"],
        check=True, capture_output=True, text=True,
    )


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
def test_harness_passes_the_host_variant(tmp_path):
    variant = best_variant(detect())
    compiler = build.find_compiler()
    assert compiler is not None
    _compile_harness(compiler, tmp_path / "harness")
    reference = build.build_variant(get_variant("scalar"))
    result = _run([str(tmp_path / "harness"), str(reference), str(build.build_variant(variant))])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"variant {variant.name}" in result.stdout and "0 failure(s)" in result.stdout


@pytest.mark.skipif(
    shutil.which(CROSS_CC) is None or shutil.which("qemu-aarch64") is None
    or not Path(SYSROOT).is_dir(),
    reason=f"needs {CROSS_CC} and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu qemu-user)",
)
@pytest.mark.parametrize("variant", ["neon_dotprod", "neon"])
def test_arm_variant_matches_scalar_under_qemu(tmp_path, variant):
    harness = tmp_path / "harness"
    _compile_harness(CROSS_CC, harness)
    reference = build.build_variant(get_variant("scalar"), compiler=CROSS_CC)
    library = build.build_variant(get_variant(variant), compiler=CROSS_CC)
    result = _run(["qemu-aarch64", "-L", SYSROOT, "-cpu", "max", str(harness),
                   str(reference), str(library)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"reference scalar, variant {variant}" in result.stdout
    assert "0 failure(s)" in result.stdout
