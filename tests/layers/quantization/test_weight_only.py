"""Weight-only int8/int4 quantization: the formats, and which weights a Linear uses when."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.layers.linear import Linear
from pagedllm.layers.quantization import (
    INT4_GROUP_SIZE,
    QUANTIZED_MAX_TOKENS,
    dequantize,
    quantize,
    quantize_int4,
    quantize_int8,
)


def _q4_1_weight(rows: int, cols: int) -> torch.Tensor:
    """A weight in GGUF Q4_1's form: per 32 values, d * q + m with q spanning 0..15."""
    gen = torch.Generator().manual_seed(0)
    groups = cols // INT4_GROUP_SIZE
    codes = torch.randint(0, 16, (rows, groups, INT4_GROUP_SIZE), generator=gen)
    codes[..., 0], codes[..., 1] = 0, 15  # Q4_1 takes d and m from the block's min and max
    # Powers of two keep d, m and d * q + m exact in float32.
    d = 2.0 ** torch.randint(-8, -4, (rows, groups, 1), generator=gen).float()
    m = -8 * d + torch.randint(-4, 4, (rows, groups, 1), generator=gen).float() * d
    return (codes.float() * d + m).view(rows, cols)


def test_int4_recovers_q4_1_weights_exactly():
    weight = _q4_1_weight(48, 96)
    quantized = quantize_int4(weight)
    assert torch.equal(dequantize(quantized, 96, torch.float32), weight)


def test_int8_error_is_at_most_half_a_step():
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    quantized = quantize_int8(weight)
    error = (dequantize(quantized, 64, torch.float32) - weight).abs()
    assert (error <= quantized.scales[:, None] / 2 + 1e-7).all()


def test_int4_matmul_matches_dequantized_weight_in_bfloat16():
    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(2))
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(3))
    quantized = quantize_int4(weight.bfloat16())
    # The kernel dequantizes on the fly and accumulates in float32: only the final rounding
    # of the output to bfloat16 differs from a float32 matmul with the dequantized weight.
    dense = dequantize(quantized, 128, torch.bfloat16).float()
    out = quantized.matmul(x.bfloat16()).float()
    torch.testing.assert_close(out, x.bfloat16().float() @ dense.t(), atol=0.1, rtol=0.02)


def test_int4_rejects_shapes_the_kernel_cannot_take():
    assert quantize(torch.randn(40, 64), "int4") is None  # rows not a multiple of 16
    with pytest.raises(ValueError, match="int4 needs"):
        quantize_int4(torch.randn(32, 48))  # columns not a multiple of 32


def test_unknown_method_is_a_value_error():
    with pytest.raises(ValueError, match="quantization must be one of"):
        quantize(torch.randn(16, 32), "int3")


def _linear(keep_dense: bool) -> tuple[Linear, torch.Tensor]:
    layer = Linear(64, 32, bias=True)
    gen = torch.Generator().manual_seed(4)
    layer.weight.data = torch.randn(32, 64, generator=gen)
    layer.bias.data = torch.randn(32, generator=gen)
    dense = layer.weight.data.clone()
    layer.process_weights_after_loading("int8", keep_dense=keep_dense)
    return layer, dense


def test_linear_uses_quantized_weights_for_small_steps_and_dense_for_large():
    layer, dense = _linear(keep_dense=True)
    deq = dequantize(layer.quantized, 64, torch.float32)
    small = torch.randn(QUANTIZED_MAX_TOKENS, 64)
    large = torch.randn(QUANTIZED_MAX_TOKENS + 1, 64)
    torch.testing.assert_close(layer(small), F.linear(small, deq, layer.bias))
    torch.testing.assert_close(layer(large), F.linear(large, dense, layer.bias))


def test_linear_without_dense_copy_always_uses_quantized_weights():
    layer, _ = _linear(keep_dense=False)
    assert layer.weight.numel() == 0  # the dense weight's memory is released
    deq = dequantize(layer.quantized, 64, torch.float32)
    large = torch.randn(3 * QUANTIZED_MAX_TOKENS, 64)
    torch.testing.assert_close(layer(large), F.linear(large, deq, layer.bias))
