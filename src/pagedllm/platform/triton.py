"""Whether Triton is installed, and whether it runs kernels in its CPU interpreter."""

from __future__ import annotations

import functools
import importlib.util
import os


@functools.cache
def triton_installed() -> bool:
    """True when the `triton` package is installed (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """True when TRITON_INTERPRET asks Triton to run kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
