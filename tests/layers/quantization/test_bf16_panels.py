"""Bf16PanelWeight (layers/quantization/bf16_panels.py, csrc/bf16_matmul.c, amx_bf16.c):
dense bfloat16 weights on our C kernel, the arithmetic of vdpbf16ps on every vector variant,
the matrix units' (AMX) exact where sums are exact, and where it serves."""

from __future__ import annotations

import pytest
import torch

from pagedllm import kernels
from pagedllm.kernels.variants import runnable_variants
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import CrossoverMethod
from pagedllm.layers.quantization import bf16_panels as bf16_panels_module
from pagedllm.layers.quantization.bf16_panels import (
    ALL_STEPS,
    NO_PANELS,
    Bf16PanelWeight,
    PanelSteps,
    choose_panel_steps,
    pack_panels,
    panels_fit,
    panels_win,
)
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect

needs_kernels = pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no vector variant")
# Every variant this CPU runs, the scalar reference included.
VARIANTS = [v.name for v in runnable_variants(detect())]
# Those with matrix units (AMX) for dense bfloat16 matmuls.
MATRIX_VARIANTS = [v.name for v in runnable_variants(detect()) if "amx_bf16" in v.requires]


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


def _on_matrix_units(variant: str) -> bool:
    """Whether `variant` multiplies on matrix units (AMX): their arithmetic is the unit's
    own, not vdpbf16ps's order."""
    return bool(kernels.load_variant(variant).lib.bf16_matrix_units())


def _panel_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ W^T by the kernel on freshly packed panels (checked bit for bit on its own)."""
    return Bf16PanelWeight.from_weight(weight).apply(x.reshape(-1, x.shape[-1]).contiguous(),
                                                     None)


def test_panels_hold_the_weight_and_give_it_back():
    weight = torch.randn(37, 10).bfloat16()  # a partial last panel
    panels = pack_panels(weight)
    assert panels.shape == (3, 5, 16, 2)
    assert torch.equal(panels[0, 2, 7], weight[7, 4:6])
    assert torch.equal(panels[2, :, 5:].abs().sum(), torch.tensor(0, dtype=torch.bfloat16))
    assert torch.equal(Bf16PanelWeight.from_weight(weight).dense(torch.bfloat16), weight)


@needs_kernels
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("rows", "cols"), [(37, 10), (80, 32), (64, 98), (100, 576)])
def test_every_variant_computes_vdpbf16ps_arithmetic_bit_for_bit(variant, rows, cols):
    """Tiles of 1 to 17 tokens, partial panels, odd pair counts, runs of 1, 2 and 3 panels:
    the same bits as the reference order on every variant (the AVX-512 BF16 instruction's or
    its emulation). Matrices on matrix units have their own order (the next tests)."""
    if _on_matrix_units(variant):
        pytest.skip("on the matrix units: their own arithmetic (exact sums tested below)")
    gen = torch.Generator().manual_seed(rows + cols)
    weight = (torch.randn(rows, cols, generator=gen) * 0.1).bfloat16()
    method = Bf16PanelWeight.from_weight(weight)
    for num_tokens in (1, 3, 4, 5, 8, 9, 17):
        x = (torch.randn(num_tokens, cols, generator=gen) * 3).bfloat16()
        got = _on(variant, lambda: method.apply(x, None))  # noqa: B023
        assert torch.equal(got, _vdpbf16ps_reference(x, weight)), (variant, num_tokens)


@needs_kernels
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("rows", "cols"), [(37, 10), (80, 32), (24, 98), (100, 576), (50, 1024)])
def test_every_variant_is_exact_where_every_sum_is(variant, rows, cols):
    """Small integers make every product and partial sum exact in float32, so any order
    gives the exact product, rounded once: this pins the layout of every path, the matrix
    units' included (token counts filling one or both halves of a 32-token block, partial
    panels, odd and even panel counts, chunks past 256 tokens, inputs past the last whole
    tile step)."""
    gen = torch.Generator().manual_seed(rows * cols)
    weight = torch.randint(-3, 4, (rows, cols), generator=gen).bfloat16()
    method = Bf16PanelWeight.from_weight(weight)
    for num_tokens in (1, 5, 16, 17, 31, 32, 33, 47, 300):
        x = torch.randint(-3, 4, (num_tokens, cols), generator=gen).bfloat16()
        got = _on(variant, lambda: method.apply(x, None))  # noqa: B023
        assert torch.equal(got, (x.float() @ weight.float().T).bfloat16()), (variant, num_tokens)


@needs_kernels
@pytest.mark.parametrize("variant", MATRIX_VARIANTS)
def test_matrix_units_round_like_a_float32_product(variant):
    """Random values on the matrix units: within a float32 sum's rounding of the float64
    product (before the final bfloat16 rounding), rows read in place x_stride apart, and
    input counts past the last whole tile step of 32 (added with vdpbf16ps)."""
    if not _on_matrix_units(variant):
        pytest.skip("the OS refused the matrix units (the vector tiles run)")
    gen = torch.Generator().manual_seed(5)
    for cols in (576, 98, 20):
        weight = (torch.randn(200, cols, generator=gen) * 0.1).bfloat16()
        x = (torch.randn(70, 1152, generator=gen) * 3).bfloat16()[:, :cols]  # rows 1152 apart
        got = _on(variant, lambda: Bf16PanelWeight.from_weight(weight).apply(x, None))  # noqa: B023
        exact = x.double() @ weight.double().T
        torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-3)


@needs_kernels
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_tokens_result_does_not_depend_on_its_batch(variant):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(96, 64, generator=gen).bfloat16()
    method = Bf16PanelWeight.from_weight(weight)
    x = torch.randn(300, 64, generator=gen).bfloat16()  # past a chunk of 256 tokens
    batched = _on(variant, lambda: method.apply(x, None))
    for row in (0, 7, 17, 255, 256, 299):
        alone = _on(variant, lambda: method.apply(x[row:row + 1], None))  # noqa: B023
        assert torch.equal(alone, batched[row:row + 1]), (variant, row)


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
    assert torch.equal(out.reshape(10, 48), _panel_product(flat, weight) + bias)
    close = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    torch.testing.assert_close(out.float(), close, atol=0.05, rtol=0.02)


@needs_kernels
def test_float32_activations_are_refused():
    method = Bf16PanelWeight.from_weight(torch.randn(16, 8).bfloat16())
    with pytest.raises(ValueError, match="bfloat16 activations"):
        method.apply(torch.randn(2, 8), None)


@needs_kernels
def test_only_even_bfloat16_cpu_matrices_fit():
    assert panels_fit(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert not panels_fit(torch.zeros(4, 7, dtype=torch.bfloat16))
    assert not panels_fit(torch.zeros(4, 8))


# (panel seconds, dense seconds) by tokens
@pytest.mark.parametrize(("timings", "serve"), [
    ({1: (1.0, 2.0), 32: (1.0, 1.0), 512: (1.05, 1.0)}, True),  # a tie at large steps
    ({1: (1.0, 2.0), 32: (1.0, 1.5), 512: (2.0, 1.0)}, False),  # matrix units win large ones
    ({1: (2.0, 1.0), 32: (1.0, 1.5), 512: (1.0, 1.0)}, False),
])
def test_the_panels_serve_where_they_never_lose(timings, serve):
    """Every step where the kernel is never slower than torch's beyond noise, else none."""
    assert panels_win(timings) is serve


# (panel seconds, dense seconds) by tokens, matrix units or not -> the steps chosen
@pytest.mark.parametrize(("timings", "crossover", "steps"), [
    ({1: (1.0, 2.0), 32: (1.0, 1.0), 512: (1.05, 1.0)}, True, ALL_STEPS),
    ({1: (1.0, 1.4), 8: (1.0, 1.2), 32: (1.0, 1.3), 128: (1.0, 0.9), 512: (1.0, 0.8)}, True,
     PanelSteps(True, 32)),
    ({1: (1.0, 1.4), 8: (1.0, 1.2), 32: (1.0, 1.3), 128: (1.0, 0.9), 512: (1.0, 0.8)}, False,
     NO_PANELS),
    ({1: (1.0, 0.95), 8: (1.0, 1.2), 32: (1.0, 0.8), 64: (1.0, 1.3), 512: (1.0, 0.8)}, True,
     PanelSteps(True, 8)),  # a tie is noise (the stack pays for the copy); a loss ends it
    ({1: (1.0, 0.8), 32: (1.0, 1.3), 512: (1.0, 0.8)}, True, NO_PANELS),
])
def test_on_matrix_units_the_panels_serve_the_small_steps_they_win(timings, crossover, steps):
    assert choose_panel_steps(timings, crossover) == steps


@needs_kernels
@pytest.mark.parametrize(("setting", "steps"), [
    ("always", ALL_STEPS), ("never", NO_PANELS), ("16", PanelSteps(True, 16)),
])
def test_the_environment_overrides_the_measurement(bf16_panels, setting, steps):
    bf16_panels(setting)
    assert bf16_panels_module.panel_steps() == steps
    assert bf16_panels_module.panels_serve() is steps.serve


@needs_kernels
def test_auto_measures_once(bf16_panels, monkeypatch):
    bf16_panels("auto")
    calls = []
    real = bf16_panels_module._measure
    monkeypatch.setattr(bf16_panels_module, "_measure", lambda: calls.append(1) or real())
    first = bf16_panels_module.panels_serve()
    assert isinstance(first, bool) and bf16_panels_module.panels_serve() is first
    assert calls == [1]


@needs_kernels
@pytest.mark.parametrize("setting", ["sometimes", "0", "-4"])
def test_an_unknown_setting_is_refused(bf16_panels, setting):
    bf16_panels(setting)
    with pytest.raises(ValueError, match="PAGEDLLM_BF16_PANELS"):
        bf16_panels_module.panels_serve()


def _loaded_layer(weight: torch.Tensor, keep_dense: bool = True):
    from pagedllm.layers.linear import Linear

    layer = Linear(weight.shape[1], weight.shape[0])
    layer.weight.data = weight.clone()
    layer.process_weights_after_loading(None, keep_dense=keep_dense)
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
    assert torch.equal(layer(x), _panel_product(x, weight))


@needs_kernels
def test_panels_for_small_steps_keep_torchs_weight_for_the_large_ones(bf16_panels):
    """Panels up to 4 tokens (matrix units' crossover): the layer holds both, steps of up to
    4 rows are the panels' product and larger ones torch's; the layer counts as dense.
    Without keep_dense_weights, torch's alone (never a slower path for large steps)."""
    from pagedllm.layers.quantization.dense import dense_method

    bf16_panels("4")
    gen = torch.Generator().manual_seed(6)
    weight = torch.randn(40, 64, generator=gen).bfloat16()
    layer = _loaded_layer(weight)
    method = layer.method
    assert isinstance(method, CrossoverMethod) and method.max_tokens == 4
    assert isinstance(method.small, Bf16PanelWeight) and not isinstance(method.large,
                                                                        Bf16PanelWeight)
    assert method.is_dense and layer.quantized is None
    torch_method = dense_method(torch.nn.Parameter(weight.clone(), requires_grad=False))
    for rows in (1, 4, 5, 9):
        x = torch.randn(rows, 64, generator=gen).bfloat16()
        want = _panel_product(x, weight) if rows <= 4 else torch_method.apply(x, None)
        assert torch.equal(layer(x), want), rows
    alone = _loaded_layer(weight, keep_dense=False).method
    assert not isinstance(alone, (CrossoverMethod, Bf16PanelWeight)) and alone.is_dense


@needs_kernels
@pytest.mark.parametrize("setting", ["always", "never", "4"])
def test_an_unquantized_head_ranks_on_the_panels(bf16_panels, setting):
    """A dense bfloat16 LM head runs its logits on the panels where they serve (a copy: the
    tied embedding and the float32 refinement read the weight), so a greedy step is one C
    call; the token is the float32 argmax either way."""
    from pagedllm.layers.embedding import LMHead, VocabEmbedding

    bf16_panels(setting)
    embedding = VocabEmbedding(300, 64)
    embedding.weight.data = torch.randn(300, 64, generator=torch.Generator().manual_seed(3))
    embedding.weight.data = embedding.weight.data.bfloat16()
    head = LMHead(300, 64, tie_to=embedding)
    head.process_weights_after_loading(None)
    assert isinstance(head.method, Bf16PanelWeight) == (setting == "always")
    assert head.weight.numel() == 300 * 64  # the embedding still reads it
    hidden = torch.randn(6, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    exact = hidden.float() @ head.weight.float().T
    assert torch.equal(head.greedy_tokens(hidden), exact.argmax(-1))
    assert (head.greedy_tail(hidden) is not None) == (setting == "always")
    if setting == "4":  # panels for steps of up to 4 rows, torch's dense method beyond
        assert isinstance(head.method, CrossoverMethod) and head.method.max_tokens == 4
        assert head.greedy_tail(hidden[:4]) is not None
        assert torch.equal(head.greedy_tokens(hidden[:4]), exact[:4].argmax(-1))
    logits = head(hidden)
    if setting == "always":
        raw = _panel_product(hidden, head.weight.data).float()
        others = torch.ones_like(raw, dtype=torch.bool).scatter_(1, raw.topk(8).indices, False)
        assert torch.equal(logits[others], raw[others])  # outside the refined top 8


@needs_kernels
@pytest.mark.parametrize("panels", ["always", "8", "2", "never"])
def test_quantized_layers_large_steps_run_as_an_unquantized_layers(
    bf16_panels, dense_from_tokens, panels
):
    """The large steps of a quantized layer that keeps a dense copy (matrix units) run as
    an unquantized layer's: the panels where they serve (alone, or torch's dense weight
    beyond their steps), else torch's dense weight; the W4A8 weight takes the small ones."""
    from pagedllm.layers.linear import Linear
    from pagedllm.layers.quantization import CrossoverMethod, W4A8Weight

    bf16_panels(panels)
    dense_from_tokens("4")
    layer = Linear(64, 40)
    layer.weight.data = torch.randn(40, 64).bfloat16()
    layer.process_weights_after_loading("int4", keep_dense=True)
    method = layer.method
    assert isinstance(method, CrossoverMethod) and isinstance(method.small, W4A8Weight)
    assert method.max_tokens == 3
    large = method.large
    if panels == "always":
        assert isinstance(large, Bf16PanelWeight)
    elif panels == "8":
        assert isinstance(large, CrossoverMethod) and large.max_tokens == 8
        assert isinstance(large.small, Bf16PanelWeight) and large.large.is_dense
    else:  # never, or only steps W4A8 takes anyway (no third copy that never serves)
        assert not isinstance(large, (Bf16PanelWeight, CrossoverMethod)) and large.is_dense
