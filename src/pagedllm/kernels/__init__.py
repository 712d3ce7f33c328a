"""The CPU kernels in C: one interface, one source per instruction set, chosen at run time.

`csrc/kernels.h` declares every kernel (paged decode and prefill attention, the int8 KV
writer, fused RMSNorm / RoPE / SiLU, the int4/int8 x int8 matmuls, the decode stack);
`csrc/isa.h` the few primitives written per ISA (`scalar.c`, the reference arithmetic;
`avx512.c`, `avx2.c`, `neon.c`). `cpu_features` reads the CPU once, `variants` lists the
builds and their flags, `plan` decides which paths the engine takes, `build` compiles a
variant into the cache, `loader` loads the chosen one. A leaf package: it imports nothing
of the engine but `envs` and the logger; layers, attention and models call it.

`python -m pagedllm.kernels` prints this machine's plan; `--build-all` builds every variant
the architecture has (for images).
"""

from pagedllm.kernels.loader import KernelLibrary, library, load_variant, pointer, use
from pagedllm.kernels.plan import CpuPlan, cpu_plan

__all__ = ["CpuPlan", "KernelLibrary", "cpu_plan", "library", "load_variant", "pointer", "use"]
