"""The CUDA platform: Triton kernels for attention and quantized weights, CUDA graphs for
decode steps, swap preemption, pinned host staging, NCCL between ranks."""

from __future__ import annotations

import gc

import torch

from pagedllm.platform.interface import Platform
from pagedllm.platform.triton import triton_installed


class CudaPlatform(Platform):
    """An NVIDIA GPU."""

    device_type = "cuda"
    pin_memory = True
    dist_backend = "nccl"

    def runs_triton(self) -> bool:
        """Whenever triton is installed."""
        return triton_installed()

    def _default_attention_backend(self, dtype: torch.dtype) -> str:
        return "triton" if self.runs_triton() else "torch_grouped"

    def _triton_groups_by_default(self) -> bool:
        return self.runs_triton()

    def decode_step_kind(self) -> str | None:
        """Captured decode forwards."""
        return "cuda_graphs"

    def captures_graphs(self) -> bool:
        """Real CUDA graphs."""
        return True

    @property
    def default_preemption_mode(self) -> str:
        """Swap: device memory is scarce and host copies are cheap next to recompute."""
        return "swap"

    def kv_cache_budget_bytes(self, gpu_memory_utilization: float) -> int:
        """The share of the GPU's memory the engine may use, less what others hold.

        An engine dropped earlier in this process (a test's, a benchmark's) can still hold
        its KV cache and graph pools through reference cycles, and torch's allocator keeps
        freed blocks cached: both are released first, or they count as used by others.
        """
        gc.collect()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        used_by_others = total - free
        return max(int(total * gpu_memory_utilization) - used_by_others, 0)

    def describe(self) -> str:
        """The GPU's name."""
        return f"cuda: {torch.cuda.get_device_name()}"
