"""Bf16PanelWeight (layers/quantization/bf16_panels.py, csrc/bf16_matmul.c): dense bfloat16
weights on our C kernel, the arithmetic of vdpbf16ps on every variant, and where it serves."""

from __future__ import annotations

import pytest
import torch

from pagedllm import kernels
from pagedllm.kernels.variants import runnable_variants
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import bf16_panels
from pagedllm.layers.quantization.bf16_panels import (
    Bf16PanelWeight,
    PanelPlan,
    pack_panels,
    panels_fit,
    plan_from_timings,
)
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect

needs_kernels = pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no vector variant")
# Every variant this CPU runs, the scalar reference included.
VARIANTS = [v.name for v in runnable_variants(detect())]


def _vdpbf16ps_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ W^T in the order isa.h defines: per pair j, the odd product then the even one
    added to a float32 sum (each product exact), rounded to bfloat16 at the end."""
    xf, wf = x.float(), weight.float()
    acc = torch.zeros(x.shape[0], weight.shape[0])
    for j in range(0, x.shape[1], 2):
        acc = acc + xf[:, j + 1, None] * wf[None, :, j + 1]
        acc = acc + xf[:, j, None] * wf[None, :, j]
    return acc.bfloat16()


def _on(variant: str, fn):
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        return fn()


def test_panels_hold_the_weight_and_give_it_back():
    weight = torch.randn(37, 10).bfloat16()  # a partial last panel
    panels = pack_panels(weight)
    assert panels.shape == (3, 5, 16, 2)
    assert torch.equal(panels[0, 2, 7], weight[7, 4:6])
    assert torch.equal(panels[2, :, 5:].abs().sum(), torch.tensor(0, dtype=torch.bfloat16))
    assert torch.equal(Bf16PanelWeight.from_weight(weight).dense(torch.bfloat16), weight)


@needs_kernels
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("rows", "cols"), [(37, 10), (64, 98), (100, 576)])
def test_every_variant_computes_vdpbf16ps_arithmetic_bit_for_bit(variant, rows, cols):
    """Tiles of 1 to 17 tokens, partial panels, odd pair counts: the same bits as the
    reference order on every variant (the AVX-512 BF16 instruction's or its emulation)."""
    gen = torch.Generator().manual_seed(rows + cols)
    weight = (torch.randn(rows, cols, generator=gen) * 0.1).bfloat16()
    method = Bf16PanelWeight.from_weight(weight)
    for num_tokens in (1, 3, 4, 5, 8, 9, 17):
        x = (torch.randn(num_tokens, cols, generator=gen) * 3).bfloat16()
        got = _on(variant, lambda: method.apply(x, None))  # noqa: B023
        assert torch.equal(got, _vdpbf16ps_reference(x, weight)), (variant, num_tokens)


@needs_kernels
def test_a_tokens_result_does_not_depend_on_its_batch():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(96, 64, generator=gen).bfloat16()
    method = Bf16PanelWeight.from_weight(weight)
    x = torch.randn(300, 64, generator=gen).bfloat16()  # past a chunk of 256 tokens
    batched = method.apply(x, None)
    for row in (0, 7, 255, 256, 299):
        assert torch.equal(method.apply(x[row:row + 1], None), batched[row:row + 1])


@needs_kernels
def test_bias_leading_dimensions_and_strided_rows():
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(48, 32, generator=gen).bfloat16()
    bias = torch.randn(48, generator=gen).bfloat16()
    method = Bf16PanelWeight.from_weight(weight)
    x = torch.randn(2, 5, 64, generator=gen).bfloat16()[..., ::2]  # [2, 5, 32], strided
    out = method.apply(x, bias)
    assert out.shape == (2, 5, 48)
    flat = x.reshape(10, 32)
    assert torch.equal(out.reshape(10, 48), _vdpbf16ps_reference(flat, weight) + bias)
    close = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    torch.testing.assert_close(out.float(), close, atol=0.05, rtol=0.02)


@needs_kernels
def test_float32_activations_are_refused():
    method = Bf16PanelWeight.from_weight(torch.randn(16, 8).bfloat16())
    with pytest.raises(ValueError, match="bfloat16 activations"):
        method.apply(torch.randn(2, 8), None)


def test_only_even_bfloat16_cpu_matrices_fit():
    assert panels_fit(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert not panels_fit(torch.zeros(4, 7, dtype=torch.bfloat16))
    assert not panels_fit(torch.zeros(4, 8))


# (panel seconds, dense seconds) by tokens
@pytest.mark.parametrize(("timings", "plan"), [
    ({1: (1.0, 2.0), 32: (1.0, 1.0), 512: (1.02, 1.0)}, PanelPlan(True)),
    ({1: (1.0, 2.0), 32: (1.0, 1.5), 512: (2.0, 1.0)}, PanelPlan(True, 32)),
    ({1: (1.0, 1.1), 32: (1.0, 1.5), 512: (2.0, 1.0)}, PanelPlan(False)),
    ({1: (2.0, 1.0), 32: (1.0, 1.5), 512: (1.0, 1.0)}, PanelPlan(False)),
])
def test_the_plan_follows_the_timings(timings, plan):
    """Every step where the kernel never loses beyond noise; small steps where it wins the
    smallest by the margin and loses larger ones; none otherwise."""
    assert plan_from_timings(timings) == plan


@needs_kernels
@pytest.mark.parametrize(("setting", "use"), [("always", True), ("never", False)])
def test_the_environment_overrides_the_measurement(monkeypatch, setting, use):
    monkeypatch.setenv("PAGEDLLM_BF16_PANELS", setting)
    bf16_panels.panel_plan.cache_clear()
    try:
        assert bf16_panels.panel_plan() == PanelPlan(use)
    finally:
        bf16_panels.panel_plan.cache_clear()


@needs_kernels
def test_an_unknown_setting_is_refused(monkeypatch):
    monkeypatch.setenv("PAGEDLLM_BF16_PANELS", "sometimes")
    bf16_panels.panel_plan.cache_clear()
    try:
        with pytest.raises(ValueError, match="PAGEDLLM_BF16_PANELS"):
            bf16_panels.panel_plan()
    finally:
        bf16_panels.panel_plan.cache_clear()


def _loaded_layer(weight: torch.Tensor):
    from pagedllm.layers.linear import Linear

    layer = Linear(weight.shape[1], weight.shape[0])
    layer.weight.data = weight.clone()
    layer.process_weights_after_loading(None, keep_dense=True)
    return layer


@needs_kernels
def test_a_dense_layer_becomes_panels_alone(bf16_panels):
    """Where the panels serve every step, the layer holds them only (the plain weight is
    freed) and is no quantized layer."""
    bf16_panels("always")
    weight = torch.randn(40, 64).bfloat16()
    layer = _loaded_layer(weight)
    assert isinstance(layer.method, Bf16PanelWeight)
    assert layer.weight.numel() == 0 and layer.quantized is None
    x = torch.randn(5, 64).bfloat16()
    assert torch.equal(layer(x), _vdpbf16ps_reference(x, weight))


@needs_kernels
def test_small_steps_on_panels_beside_torchs_weight(monkeypatch):
    """Where the panels win only small steps (matrix units), torch's method keeps the
    larger ones."""
    from pagedllm.layers.quantization import CrossoverMethod, selection

    monkeypatch.setattr(selection, "panel_plan", lambda: PanelPlan(True, 8))
    weight = torch.randn(40, 64).bfloat16()
    layer = _loaded_layer(weight)
    method = layer.method
    assert isinstance(method, CrossoverMethod) and method.max_tokens == 8
    assert isinstance(method.small, Bf16PanelWeight) and method.large.is_dense
    small, large = torch.randn(8, 64).bfloat16(), torch.randn(9, 64).bfloat16()
    assert torch.equal(layer(small), _vdpbf16ps_reference(small, weight))
    assert torch.equal(layer(large), method.large.apply(large, None))
