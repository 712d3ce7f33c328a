"""The C multi-LoRA kernel (kernels/csrc/lora.c) for bfloat16 steps on CPU.

One call per linear layer adds every token's adapter delta, whatever the number of
adapters: no gather, no padding, no index_add, and no block of zeros between a fused
layer's sub-outputs. It pays for small steps (decodes); large ones (prefill chunks) go to
torch's batched matmuls, which use the CPU's matrix units (`MAX_TOKENS`, measured:
BENCHMARKS.md "LoRA").
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import torch

from pagedllm import kernels
from pagedllm.kernels import pointer

if TYPE_CHECKING:
    from pagedllm.lora.layers import LoRABatch

# Steps with more tokens than this run torch's batched matmuls instead (prefill chunks).
MAX_TOKENS = 256


def kernel_library(dtype: torch.dtype, device: torch.device) -> Any | None:
    """The kernel library when the C path applies (bfloat16 on CPU, kernels built)."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return None
    library = kernels.library()
    return None if library is None else library.lib


def serves(batch: LoRABatch, x: torch.Tensor, out: torch.Tensor) -> bool:
    """True when this step's delta is for the kernel (few tokens, row-major rows)."""
    return (
        batch.num_tokens <= MAX_TOKENS
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
        ctypes.c_int64(batch.order.shape[0]), ctypes.c_int64(x.shape[1]),
        ctypes.c_int64(out.shape[1]), pointer(x), ctypes.c_int64(x.stride(0)),
        pointer(out), ctypes.c_int64(out.stride(0)), pointer(batch.order),
        pointer(batch.order_slots), ctypes.c_int64(sub_offsets.shape[0] - 1),
        pointer(sub_offsets), ctypes.c_int64(rank), pointer(lora_a), pointer(lora_b_sub),
    )
    if failed:
        raise MemoryError("The LoRA kernel could not allocate its buffers.")
