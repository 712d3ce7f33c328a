"""Triton kernels for GPUs: paged attention and int4/int8 group-quantized matmuls.

A leaf package like `kernels/` (the C kernels): attention and layers call it, it imports
nothing of the engine. Triton is imported only when a kernel is first used, so CPU runs
never load it. With `TRITON_INTERPRET=1` Triton runs the same kernels on CPU tensors in its
interpreter (numpy): CI checks their logic that way, the GPU runs them compiled.
"""

from pagedllm.triton_kernels.runtime import interpreting, jit_kernel

__all__ = ["interpreting", "jit_kernel"]
