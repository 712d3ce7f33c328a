"""Weight formats and the linear methods that run them (base.py explains the interface).

A layer loads dense values or a checkpoint's group codes (codes.py), and after loading one
method is chosen for it (selection.py) from its format and its platform: dense or packed
oneDNN (dense.py), W4A8 / W8A8 / split weights on our C kernels (byte_dot.py), torch's
weight-only int4 / int8 (weight_only.py), group codes on the Triton kernel
(triton_groups.py), or two of these by step size (crossover.py).
"""

import torch

from pagedllm.layers.quantization.base import (
    LinearMethod,
    QuantizedMethod,
    ReorderedInput,
)
from pagedllm.layers.quantization.bf16_panels import Bf16PanelWeight
from pagedllm.layers.quantization.byte_dot import (
    PANEL_ROWS,
    SplitWeight,
    W4A8Weight,
    W8A8Weight,
    can_quantize_w4a8,
    quantize_w4a8,
    quantize_w8a8,
    w4a8_from_codes,
    w8a8_from_codes,
)
from pagedllm.layers.quantization.codes import (
    FP8_MAX,
    INT4_GROUP_SIZE,
    GroupCodes,
    fp8_grid,
    int4_group_codes,
)
from pagedllm.layers.quantization.crossover import CrossoverMethod
from pagedllm.layers.quantization.dense import DenseMethod, PackedDenseMethod
from pagedllm.layers.quantization.selection import (
    WeightPlan,
    select_linear_method,
    select_lm_head_methods,
)
from pagedllm.layers.quantization.triton_groups import (
    TritonGroupWeight,
    quantize_for_triton,
    triton_weight_from_codes,
    uses_triton_weights,
)
from pagedllm.layers.quantization.weight_only import (
    QUANTIZED_MAX_TOKENS,
    Int4Weight,
    Int8Weight,
    can_quantize_int4,
    quantize,
    quantize_int4,
    quantize_int8,
)


def dequantize(weight: LinearMethod, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """The dense [out, in] weight a method stands for (for tests and checks)."""
    del in_features  # every method knows its own shape
    return weight.dense(dtype)


__all__ = [
    "FP8_MAX",
    "INT4_GROUP_SIZE",
    "PANEL_ROWS",
    "QUANTIZED_MAX_TOKENS",
    "Bf16PanelWeight",
    "CrossoverMethod",
    "DenseMethod",
    "GroupCodes",
    "Int4Weight",
    "Int8Weight",
    "LinearMethod",
    "PackedDenseMethod",
    "QuantizedMethod",
    "ReorderedInput",
    "SplitWeight",
    "TritonGroupWeight",
    "W4A8Weight",
    "W8A8Weight",
    "WeightPlan",
    "can_quantize_int4",
    "can_quantize_w4a8",
    "dequantize",
    "fp8_grid",
    "int4_group_codes",
    "quantize",
    "quantize_for_triton",
    "quantize_int4",
    "quantize_int8",
    "quantize_w4a8",
    "quantize_w8a8",
    "select_linear_method",
    "select_lm_head_methods",
    "triton_weight_from_codes",
    "uses_triton_weights",
    "w4a8_from_codes",
    "w8a8_from_codes",
]
