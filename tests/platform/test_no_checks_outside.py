"""Device and CPU-capability checks live in the platform only (platform/): every other
module asks it. A grep over the source for the shapes such a check takes."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "pagedllm"

# What a device or capability check looks like in this code base.
CHECKS = re.compile(
    r"cuda\.is_available|\.device\.type\b|\bdevice_type\s*[!=]=|\.type\s*[!=]=\s*\"(cpu|cuda)\""
    r"|[!=]=\s*\"(cpu|cuda)\"|\"(cpu|cuda)\"\s*[!=]="
    r"|\bcpu_plan\(|plan\.(native_bf16|byte_dot_kernels|variant)\b|get_cpu_capability"
    r"|mkldnn\.is_available|_is_mkldnn_bf16_supported|/proc/cpuinfo|\bhas_native_bf16\("
    r"|find_spec\(\"triton\"\)|platform\.machine\(\)|environ.*TRITON_INTERPRET"
)
# Where checks belong: the platform itself, and the kernels' build (which compiles for a
# named architecture, choosing nothing).
ALLOWED = ("platform/", "kernels/build.py", "kernels/variants.py")


def test_no_device_or_capability_check_outside_the_platform():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith(ALLOWED):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if CHECKS.search(code):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_pattern_catches_the_usual_checks():
    for line in ('if x.device.type == "cpu":', "torch.cuda.is_available()",
                 'device == "cuda"', "cpu_plan().native_bf16", "plan.byte_dot_kernels",
                 'os.environ.get("TRITON_INTERPRET")'):
        assert CHECKS.search(line), line
