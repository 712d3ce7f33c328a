"""Loading the C kernels leaves the caller's floating-point mode as it was: the -ffast-math
start-up code would turn on flush-to-zero in the loading thread (found when hypothesis
refused to generate floats in a process that had loaded them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import sys
from pagedllm.platform import cpu_platform
before = sys.float_info.min / 2 == 0.0
loaded = cpu_platform().kernel_library() is not None
print(loaded, before, sys.float_info.min / 2 == 0.0)
"""


def test_loading_keeps_subnormals():
    # A fresh interpreter: this process may have loaded the library long ago.
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         check=True, timeout=600).stdout.split()
    loaded, before, after = (word == "True" for word in out[-3:])
    if not loaded:
        pytest.skip("no C compiler: the kernels are not built")
    assert not before and not after
