"""The CPU kernels in C: one interface, one source per instruction set, chosen at run time.

`csrc/kernels.h` declares every kernel (paged decode and prefill attention, the int8 KV
writer, fused RMSNorm / RoPE / SiLU, the int4/int8 x int8 and dense bf16 matmuls, the decode
stack), and
`abi.py` declares them for ctypes; `csrc/isa.h` the few primitives written per ISA
(`scalar.c`, the reference arithmetic; `avx512.c`, `avx2.c`, `neon.c`). `variants` lists
the builds and their flags, `build` compiles a variant into the cache, `loader` loads one.
Which variant this CPU runs is the platform's decision (platform/cpu_plan.py), and the
platform holds the loaded library. A leaf package: it imports nothing of the engine but
`envs`; `python -m pagedllm.platform --build-all` builds every variant (for images).
"""

from pagedllm.kernels.loader import KernelLibrary, load_variant, pointer

__all__ = ["KernelLibrary", "load_variant", "pointer"]
