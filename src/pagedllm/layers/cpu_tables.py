"""Layers as the C kernels take them: tables of pointers into their weights.

A matrix is a `StackMatrix` (kernels.h) when its weight is one our kernels multiply: a byte
dot-product one (W4A8, W8A8, or two of them summed: a split GGUF format) or dense bfloat16
panels (Bf16PanelWeight), and a sparse MLP a `StackMoE` when its
router is dense bfloat16 and every expert's matrices are such weights. csrc/moe.c and the
decode stack (worker/decode_step/cpu_stack.py) read them; the tables hold no weights, only
addresses, so the layer must outlive them.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from pagedllm.kernels.abi import (
    FMT_BF16,
    FMT_INT8,
    STACK_GELU_TANH,
    STACK_SILU,
    StackMatrix,
    StackMoE,
    StackWeight,
)
from pagedllm.layers.activation import ActivationAndMul, SiluAndMul
from pagedllm.layers.linear import Linear
from pagedllm.layers.quantization import (
    Bf16PanelWeight,
    CrossoverMethod,
    LinearMethod,
    SplitWeight,
    W4A8Weight,
    W8A8Weight,
)

if TYPE_CHECKING:
    from pagedllm.layers.mlp import GatedMLP
    from pagedllm.layers.moe import FusedMoE

KernelWeight = W4A8Weight | W8A8Weight | Bf16PanelWeight


def kernel_parts(linear: Linear) -> tuple[list[KernelWeight], int | None] | None:
    """The weights whose products sum to the layer's matmul on small steps, and the largest
    step they serve (None: every step; a crossover sends larger ones to a dense weight);
    None when the layer runs something else."""
    return method_kernel_parts(linear.method.base_method())


def method_kernel_parts(method: LinearMethod) -> tuple[list[KernelWeight], int | None] | None:
    """kernel_parts of a bare linear method (an LM head's, which is no Linear)."""
    limit = None
    if isinstance(method, CrossoverMethod):
        limit = method.max_tokens
        method = method.small
    if isinstance(method, (W4A8Weight, W8A8Weight, Bf16PanelWeight)):
        return [method], limit
    if isinstance(method, SplitWeight):
        return [method.first, method.second], limit
    return None


def large_panels(method: LinearMethod) -> tuple[Bf16PanelWeight, int, int | None] | None:
    """(panels, first step size, largest step size or None: any) when `method` is a byte
    dot-product weight whose large steps run bfloat16 panels (a quantized layer's crossover
    on matrix units, selection.py), else None."""
    if not isinstance(method, CrossoverMethod) or method_kernel_parts(method.small) is None:
        return None
    large, first = method.large, method.max_tokens + 1
    if isinstance(large, Bf16PanelWeight):
        return large, first, None
    if isinstance(large, CrossoverMethod) and isinstance(large.small, Bf16PanelWeight):
        return large.small, first, large.max_tokens
    return None


def stack_limit(linear: Linear) -> int | None:
    """The largest step the matrix's table serves (None: every step): its large panels'
    limit where it has them, else its byte dot-product weight's (kernel_parts)."""
    method = linear.method.base_method()
    large = large_panels(method)
    if large is not None:
        return large[2]
    found = method_kernel_parts(method)
    return None if found is None else found[1]


def stack_capacity(linear: Linear) -> int | None:
    """The largest step the matrix's table can run at all, faster or not (None: any):
    panels multiply steps of every size, so only a byte dot-product weight whose large
    steps go to torch's dense weight alone stops at its crossover (stack_limit is where
    the table is measured to be the faster method)."""
    method = linear.method.base_method()
    if large_panels(method) is not None:
        return None
    found = method_kernel_parts(method)
    if found is None or all(isinstance(part, Bf16PanelWeight) for part in found[0]):
        return None
    return found[1]


def extend_panels(method: LinearMethod, max_tokens: int) -> None:
    """Let `method`'s bf16 panels serve steps of up to `max_tokens` rows where they stop
    short of that, torch's dense weight keeping the larger ones: a dense layer's crossover,
    or a quantized layer's large steps' (the decode stack's measured reach,
    worker/decode_step/stack_reach.py, so the layers multiply as the stack does)."""
    crossover = method
    if isinstance(method, CrossoverMethod) and not isinstance(method.small, Bf16PanelWeight):
        crossover = method.large  # a quantized layer's: its large steps' method
    if (
        isinstance(crossover, CrossoverMethod) and isinstance(crossover.small, Bf16PanelWeight)
        and crossover.max_tokens < max_tokens
    ):
        crossover.max_tokens = max_tokens


def stack_matrix(linear: Linear) -> StackMatrix | None:
    """The matrix's table (bias included; its large panels too, large_panels), or None when
    its weight is not one of our kernels' (kernel_parts) or its bias is not bfloat16."""
    found = kernel_parts(linear)
    if found is None or (linear.bias is not None and linear.bias.dtype != torch.bfloat16):
        return None
    matrix = parts_matrix(found[0])
    matrix.bias = None if linear.bias is None else linear.bias.data_ptr()
    large = large_panels(linear.method.base_method())
    if large is not None:
        matrix.large, matrix.large_from = _weight(large[0]), large[1]
    return matrix


def parts_matrix(parts: list[KernelWeight]) -> StackMatrix:
    """The table of one or two of our kernels' weights summed (no bias)."""
    matrix = StackMatrix()
    for index, part in enumerate(parts):
        matrix.parts[index] = _weight(part)
    return matrix


def _weight(weight: KernelWeight) -> StackWeight:
    if isinstance(weight, W4A8Weight):
        return StackWeight(weight.packed.data_ptr(), weight.scales_and_mins.data_ptr(),
                           weight.kernel_format())
    if isinstance(weight, Bf16PanelWeight):
        return StackWeight(weight.panels.data_ptr(), None, FMT_BF16)
    return StackWeight(weight.codes.data_ptr(), weight.scales.data_ptr(), FMT_INT8)


def gated_activation_code(mlp: GatedMLP) -> int | None:
    """A gated MLP's activation as the kernels name it (STACK_*), or None."""
    act = mlp.act_fn
    if type(act) is SiluAndMul:
        return STACK_SILU
    if type(act) is ActivationAndMul and act.activation == "gelu_tanh":
        return STACK_GELU_TANH
    return None


class MoETable:
    """A FusedMoE's StackMoE with the arrays it points into, and its activation code."""

    def __init__(self, table: StackMoE, arrays: list[ctypes.Array[StackMatrix]],
                 routers: list[torch.Tensor], activation: int, max_tokens: int | None) -> None:
        self.table = table
        self.arrays = arrays  # kept alive: the table points into them
        self.routers = routers  # and into these
        self.activation = activation
        self.max_tokens = max_tokens  # the experts' crossover to dense weights, if any


def moe_table(moe: FusedMoE) -> MoETable | None:
    """The sparse MLP's table, or None where csrc/moe.c cannot run it (experts on other
    ranks, weights in other formats, a non-bfloat16 router, another activation)."""
    from pagedllm.layers.mlp import GatedMLP

    experts = [e for e in moe.experts if isinstance(e, GatedMLP)]
    if len(experts) != moe.num_experts or moe.tp_group.world_size != 1:
        return None
    if not 0 < moe.top_k <= moe.num_experts:
        return None
    activation = gated_activation_code(experts[0])
    shared = moe.shared_expert
    gated = [*experts, *([shared] if shared is not None else [])]
    if activation is None or any(gated_activation_code(e) != activation for e in gated):
        return None
    gates = [moe.gate, *([moe.shared_expert_gate] if moe.shared_expert_gate else [])]
    if any(not r.method.is_dense or r.bias is not None for r in gates):
        return None
    # Row-major bfloat16 copies (the layer may hold its weight in oneDNN's packed layout).
    routers = [r.method.dense(torch.bfloat16).contiguous() for r in gates]
    if any(r.dtype != torch.bfloat16 for r in routers):
        return None
    linears = [m for e in gated for m in (e.gate_up_proj, e.down_proj)]
    found = [stack_matrix(m) for m in linears]
    matrices = [m for m in found if m is not None]
    if len(matrices) != len(found):
        return None
    limits = [limit for m in linears if (limit := stack_limit(m)) is not None]
    gate_up = (StackMatrix * moe.num_experts)(*matrices[0 : 2 * moe.num_experts : 2])
    down = (StackMatrix * moe.num_experts)(*matrices[1 : 2 * moe.num_experts : 2])
    table = StackMoE(
        num_experts=moe.num_experts, top_k=moe.top_k, renormalize=int(moe.renormalize),
        intermediate=experts[0].down_proj.input_size,
        router=routers[0].data_ptr(),
        gate_up=ctypes.cast(gate_up, ctypes.c_void_p), down=ctypes.cast(down, ctypes.c_void_p),
    )
    if shared is not None and moe.shared_expert_gate is not None:
        table.shared_intermediate = shared.down_proj.input_size
        table.shared_gate_up, table.shared_down = matrices[-2], matrices[-1]
        table.shared_gate = routers[1].data_ptr()
    return MoETable(table, [gate_up, down], routers, activation, min(limits) if limits else None)
