"""The C build helpers' memory hand-back (release_free_heap)."""

from __future__ import annotations

import ctypes
import platform

import pytest

from pagedllm.utils import native


def _resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_release_free_heap_returns_freed_pages_to_the_os():
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 32 MB in blocks below malloc's mmap threshold: they come from the heap, and the last
    # one, kept, pins the heap's top so that free() alone cannot shrink it.
    blocks = [libc.malloc(64 << 10) for _ in range(512)]
    for block in blocks:
        ctypes.memset(block, 1, 64 << 10)
    for block in blocks[:-1]:
        libc.free(block)
    before = _resident_mb()
    assert native.release_free_heap()
    after = _resident_mb()
    libc.free(blocks[-1])
    assert before - after > 16
