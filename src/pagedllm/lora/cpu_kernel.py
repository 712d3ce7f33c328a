"""The C multi-LoRA kernel (kernels/csrc/lora.c) for bfloat16 steps on CPU.

One call per linear layer adds every token's adapter delta, whatever the number of
adapters: no gather, no padding, no index_add, and no block of zeros between a fused
layer's sub-outputs. Where bfloat16 matmuls are native (AVX-512 BF16, AMX), torch's batched
matmuls win for large steps (prefill chunks): the kernel takes steps up to
`NATIVE_BF16_MAX_TOKENS`. Elsewhere torch emulates bfloat16 matmuls and the kernel is
15-20x faster at every size (BENCHMARKS.md "LoRA"): it takes every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from pagedllm.kernels import pointer
from pagedllm.platform import cpu_platform, get_platform

if TYPE_CHECKING:
    from pagedllm.lora.layers import LoRABatch

# Measured crossover with native bfloat16 matmuls (per layer, 8 adapters of rank 16):
# the kernel wins 1.1-1.7x at 64 tokens, loses 1.2-2x at 256.
NATIVE_BF16_MAX_TOKENS = 128
# Steps with more tokens than this run torch's batched matmuls instead (None: none do).
MAX_TOKENS: int | None = None


def kernel_library(dtype: torch.dtype, device: torch.device) -> Any | None:
    """The kernel library when the C path applies (bfloat16 on CPU, kernels built)."""
    if not get_platform(device).lora_kernel(dtype):
        return None
    library = cpu_platform().kernel_library()
    return None if library is None else library.lib


def max_tokens() -> int | None:
    """The largest step the kernel takes on this CPU (None: any)."""
    if MAX_TOKENS is not None:
        return MAX_TOKENS
    return NATIVE_BF16_MAX_TOKENS if cpu_platform().native_bf16_matmuls() else None


def takes(num_tokens: int) -> bool:
    """True when a step of `num_tokens` is for the kernel on this CPU."""
    limit = max_tokens()
    return limit is None or num_tokens <= limit


def serves(batch: LoRABatch, x: torch.Tensor, out: torch.Tensor) -> bool:
    """True when this step's delta is for the kernel (few tokens, row-major rows)."""
    return (
        takes(batch.num_tokens)
        and x.dtype == out.dtype == torch.bfloat16
        and x.stride(-1) == 1 and out.stride(-1) == 1
    )


def add_deltas(
    library: Any, batch: LoRABatch, x: torch.Tensor, out: torch.Tensor,
    lora_a: torch.Tensor, lora_b_sub: torch.Tensor, sub_offsets: torch.Tensor, rank: int,
) -> None:
    """out[t] += delta of token t's adapter, for every token that has one."""
    assert batch.order is not None and batch.order_slots is not None
    failed = library.lora_add_bf16(
        batch.order.shape[0], x.shape[1], out.shape[1], pointer(x), x.stride(0),
        pointer(out), out.stride(0), pointer(batch.order), pointer(batch.order_slots),
        sub_offsets.shape[0] - 1, pointer(sub_offsets), rank, pointer(lora_a),
        pointer(lora_b_sub),
    )
    if failed:
        raise MemoryError("The LoRA kernel could not allocate its buffers.")
