"""Native memory helpers (the C kernels themselves are built by pagedllm.kernels)."""

from __future__ import annotations

import ctypes


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim); False without glibc.

    Memory freed by malloc stays in its free lists, counted in this process's resident
    size, unless it sits at the top of the heap. After loading, that is the dense weights
    just replaced by quantized ones (tens of MB on the default model, measured).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
