"""The int4/int8 x int8 kernel (W4A8Weight, W8A8Weight): its layout, its arithmetic, and the
LM head using it.

The reference quantizes the activations the way the kernel documents (per token and 16
values, scale max |x| / 127, round to nearest) and does the rest in float64, so the kernel
must match it up to bfloat16 output rounding and float32 accumulation; against
unquantized activations it is within the int8 quantization error.
"""

from __future__ import annotations

import pytest
import torch

from pagedllm.layers import cpu_ops
from pagedllm.layers.embedding import REFINED_CANDIDATES, LMHead, VocabEmbedding
from pagedllm.layers.linear import Linear, default_weight_loader
from pagedllm.layers.quantization import (
    CrossoverMethod,
    GroupCodes,
    Int8Weight,
    W4A8Weight,
    W8A8Weight,
    can_quantize_w4a8,
    dequantize,
    int4_group_codes,
    quantize_int4,
    quantize_w4a8,
    quantize_w8a8,
)

# Both formats of the byte dot-product kernel: int4 (Q4_1's form) and int8 (Q8_0's).
FORMATS = [pytest.param(quantize_w4a8, id="w4a8"), pytest.param(quantize_w8a8, id="w8a8")]

pytestmark = pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no C compiler")


@pytest.fixture(autouse=True)
def _quantized_for_every_step(dense_from_tokens):
    """These tests are about the kernels: no step goes to dense weights, whatever the CPU
    (with matrix units the engine keeps dense weights for large steps; tested below)."""
    dense_from_tokens("never")


def _reference(
    x: torch.Tensor, weight: W4A8Weight | W8A8Weight, in_features: int
) -> torch.Tensor:
    """x @ W^T with x quantized as the kernel does (per 16 values for int4 weights, 32 for
    int8 ones), summed in float64."""
    groups = x.float().view(x.shape[0], -1, 16 if isinstance(weight, W4A8Weight) else 32)
    step = groups.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(step > 0, 127 / groups.abs().amax(-1, keepdim=True), 0)
    xq = (groups * inv).round() * step
    dense = dequantize(weight, in_features, torch.float32).double()
    return xq.view(x.shape[0], -1).double() @ dense.T


def test_layout_holds_the_int4_codes():
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(0)).bfloat16()
    packed = quantize_w4a8(w)
    # 3 panels of 16 rows x 4 groups: 256 bytes of codes, 16 scales and 16 minimums each.
    assert packed.packed.shape == (3, 4, 256) and packed.packed.dtype == torch.uint8
    assert packed.scales_and_mins.shape == (3, 4, 2, 16)
    # d and m as Q4_1 stores them, in float16: 0.625 bytes a weight.
    assert packed.scales_and_mins.dtype == torch.float16 and packed.nbytes() == 48 * 128 * 5 // 8
    # Exactly the group codes with float16 d and m, and as close to w as torch's int4 format.
    codes, scales, mins = int4_group_codes(w, 32, half=True)
    assert torch.equal(scales.half().float(), scales) and torch.equal(mins.half().float(), mins)
    want = (codes * scales[..., None] + mins[..., None]).view(48, 128)
    assert torch.equal(dequantize(packed, 128, torch.float32), want)
    torch_int4 = dequantize(quantize_int4(w.float()), 128, torch.float32)
    error = (want - w.float()).abs().max()
    assert error <= (torch_int4 - w.float()).abs().max() * 1.01


def test_int8_layout_holds_q8_0_codes():
    gen = torch.Generator().manual_seed(1)
    scales = torch.rand(40, 4, 1, generator=gen) * 0.01 + 0.001
    codes = torch.randint(-127, 128, (40, 4, 32), generator=gen)
    codes[:, :, 0] = 127  # each group reaches its range, so d is recovered exactly
    w = (codes * scales).view(40, 128).bfloat16()
    weight = quantize_w8a8(w)
    # 40 rows fill 3 panels of 16 (the last one padded), 4 groups of 512 code bytes each.
    assert weight.codes.shape == (3, 4, 512) and weight.codes.dtype == torch.uint8
    assert weight.scales.shape == (3, 4, 16)
    # The dense bfloat16 weight keeps 8 significant bits, so a code of up to 127 can come
    # back one off; the weight itself is kept to within half a step.
    dense = dequantize(weight, 128, torch.float32).view(40, 4, 32)
    row_scales = weight.scales.transpose(1, 2).reshape(48, 4)[:40]
    recovered = (dense / row_scales[..., None]).round().long()
    assert (recovered - codes).abs().max() <= 1
    torch.testing.assert_close(row_scales, scales.squeeze(-1), atol=0, rtol=2**-7)
    error = (dense - w.float().view(40, 4, 32)).abs()
    assert (error <= 0.5 * row_scales[..., None] * (1 + 2**-6)).all()


@pytest.mark.parametrize("num_tokens", [1, 5, 17])
@pytest.mark.parametrize("symmetric", [True, False], ids=["q4_0", "q4_1"])
def test_float16_scales_give_the_float32_scales_products(num_tokens, symmetric):
    """GGUF Q4_0 / Q4_1 scales are float16: kept as float16 (Q4_1: 0.625 bytes a weight;
    Q4_0, whose minimums are all -8 d, the scales alone: 0.5625), the kernel's products are
    bit-identical to the same scales and minimums in float32; scales a float16 would round
    stay float32."""
    from pagedllm.layers.quantization import w4a8_from_codes

    gen = torch.Generator().manual_seed(num_tokens)
    codes = torch.randint(0, 16, (40, 6, 32), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(40, 6, generator=gen) * 0.05).half().float()
    mins = -8 * scales if symmetric else (torch.randn(40, 6, generator=gen) * 0.2).half().float()
    weight = w4a8_from_codes(GroupCodes(codes, scales, mins))
    assert isinstance(weight, W4A8Weight) and weight.symmetric == symmetric
    assert weight.scales_and_mins.dtype == torch.float16
    as_float32 = W4A8Weight(weight.packed, _float32_layout(scales, mins), 40)
    assert weight.scales_and_mins.nbytes * (4 if symmetric else 2) == (
        as_float32.scales_and_mins.nbytes
    )
    x = (torch.randn(num_tokens, 192, generator=gen) * 2).bfloat16()
    assert torch.equal(weight.matmul(x), as_float32.matmul(x))
    assert torch.equal(weight.dense(torch.float32), as_float32.dense(torch.float32))
    rounded = w4a8_from_codes(GroupCodes(codes, scales * (1 + 2**-20), mins))
    assert isinstance(rounded, W4A8Weight)
    assert rounded.scales_and_mins.dtype == torch.float32 and not rounded.symmetric


def _float32_layout(scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """Per-row scales and minimums [rows, groups] (rows padded to panels of 16) in the
    float32 [panels, groups, 2, 16] layout."""
    rows, groups = scales.shape
    padded = -(-rows // 16) * 16
    both = torch.zeros(padded, groups, 2)
    both[:rows, :, 0], both[:rows, :, 1] = scales, mins
    return both.view(-1, 16, groups, 2).permute(0, 2, 3, 1).contiguous()


@pytest.mark.parametrize("quantizer", FORMATS)
@pytest.mark.parametrize("num_tokens", [1, 3, 16, 17, 70])
@pytest.mark.parametrize(("rows", "cols"), [(130, 64), (256, 576), (48, 96)])
def test_matmul_matches_reference(quantizer, num_tokens, rows, cols):
    gen = torch.Generator().manual_seed(num_tokens + rows)
    w = torch.randn(rows, cols, generator=gen).bfloat16()
    weight = quantizer(w)
    x = (torch.randn(num_tokens, cols, generator=gen) * 2).bfloat16()
    out = weight.matmul(x)
    assert out.shape == (num_tokens, rows) and out.dtype == torch.bfloat16
    want = _reference(x, weight, cols)
    # bfloat16 output rounding, plus float32 accumulation of terms that largely cancel
    # (the codes' share against the group minimums' share).
    bound = want.abs() * 2**-8 + 2e-3 * want.abs().max()
    assert ((out.double() - want).abs() <= bound).all()
    exact = x.double() @ dequantize(weight, cols, torch.float32).double().T
    assert (out.double() - exact).abs().max() < 0.02 * exact.abs().max()


@pytest.mark.parametrize("quantizer", FORMATS)
def test_a_tokens_result_does_not_depend_on_the_others(quantizer):
    """Each token is quantized and multiplied on its own, so batching changes nothing."""
    gen = torch.Generator().manual_seed(2)
    weight = quantizer(torch.randn(80, 192, generator=gen).bfloat16())
    x = torch.randn(21, 192, generator=gen).bfloat16()
    together = weight.matmul(x)
    for t in (0, 7, 8, 20):
        assert torch.equal(together[t], weight.matmul(x[t : t + 1])[0])


@pytest.mark.parametrize("quantizer", FORMATS)
def test_matmul_reads_strided_rows(quantizer):
    w = torch.randn(64, 128).bfloat16()
    weight = quantizer(w)
    wide = torch.randn(4, 300).bfloat16()
    x = wide[:, 10:138]
    torch.testing.assert_close(weight.matmul(x), weight.matmul(x.contiguous()), atol=0, rtol=0)


@pytest.mark.parametrize("quantizer", FORMATS)
def test_zero_activations_give_zero(quantizer):
    weight = quantizer(torch.randn(32, 64).bfloat16())
    assert not weight.matmul(torch.zeros(2, 64, dtype=torch.bfloat16)).any()


def test_only_bfloat16_cpu_weights_with_whole_groups():
    assert can_quantize_w4a8(torch.randn(16, 96).bfloat16())
    assert not can_quantize_w4a8(torch.randn(16, 128))
    assert not can_quantize_w4a8(torch.randn(16, 100).bfloat16())  # not whole groups of 32
    with pytest.raises(ValueError, match="W4A8"):
        quantize_w4a8(torch.randn(16, 100).bfloat16())
    with pytest.raises(ValueError, match="W8A8"):
        quantize_w8a8(torch.randn(16, 100).bfloat16())


@pytest.mark.parametrize("keep_dense", [True, False])
def test_linear_keeps_no_dense_copy_beside_w4a8(keep_dense):
    """Where the kernel is fastest at every step size, the dense weight is released."""
    linear = Linear(64, 48)
    linear.weight.data = torch.randn(48, 64).bfloat16()
    want = dequantize(quantize_w4a8(linear.weight.data), 64, torch.bfloat16)
    linear.process_weights_after_loading("int4", keep_dense)
    assert isinstance(linear.method, W4A8Weight) and linear.quantized is linear.method
    assert linear.weight.numel() == 0 and not linear.keeps_dense
    x = torch.randn(40, 64).bfloat16()
    torch.testing.assert_close(linear(x), linear.quantized.matmul(x), atol=0, rtol=0)
    exact = x.float() @ want.float().T
    assert (linear(x).float() - exact).abs().max() < 0.02 * exact.abs().max()


def _head(keep_dense: bool, dtype=torch.bfloat16) -> LMHead:
    embedding = VocabEmbedding(512, 128)
    embedding.weight.data = torch.randn(512, 128, generator=torch.Generator().manual_seed(4))
    embedding.weight.data = embedding.weight.data.to(dtype)
    head = LMHead(512, 128, tie_to=embedding)
    head.process_weights_after_loading("int4", keep_dense)
    return head


@pytest.mark.parametrize("ranking_only", [False, True])
def test_head_refines_its_top_candidates_in_float32(ranking_only):
    head = _head(keep_dense=True)
    # The W8A8 weight serves every step, the W4A8 shortlist every argmax-only one.
    assert isinstance(head.method, W8A8Weight)
    assert isinstance(head.shortlist, W4A8Weight)
    hidden = torch.randn(24, 128, generator=torch.Generator().manual_seed(5))
    logits = head(hidden.bfloat16(), ranking_only)
    exact = hidden.bfloat16().float() @ head.weight.float().T
    # The winners are recomputed in float32: same argmax, same value.
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    best = exact.argmax(-1, keepdim=True)
    torch.testing.assert_close(logits.gather(1, best), exact.gather(1, best), atol=1e-4, rtol=1e-5)


def test_head_logits_for_probabilities_are_8_bit_accurate():
    """Without ranking_only every logit is close (the softmax normaliser sums them all);
    the 4-bit shortlist's are several times further off, which is why it only ranks."""
    head = _head(keep_dense=True)
    hidden = torch.randn(3, 128, generator=torch.Generator().manual_seed(6)).bfloat16()
    exact = hidden.float() @ head.weight.float().T
    full_error = (head(hidden) - exact).abs().mean()
    shortlist_error = (head(hidden, ranking_only=True) - exact).abs().mean()
    assert full_error < 0.02 * exact.abs().mean()
    assert shortlist_error > 4 * full_error


def test_head_formats_without_dense_weights_or_in_float32():
    lean = _head(keep_dense=False)
    assert isinstance(lean.method, W8A8Weight) and lean.shortlist is None
    assert isinstance(_head(keep_dense=True, dtype=torch.float32).quantized, Int8Weight)


def _q4_1_codes(weight: torch.Tensor) -> GroupCodes:
    """`weight` as a Q4_1 file would store it: per 32 values, d * q + m, q in 0..15."""
    groups = weight.float().view(weight.shape[0], -1, 32)
    low, high = groups.amin(-1), groups.amax(-1)
    scales = (high - low) / 15
    codes = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15)
    return GroupCodes(codes.to(torch.uint8), scales, low)


def _q4_0_codes(weight: torch.Tensor) -> GroupCodes:
    """`weight` as a Q4_0 file would store it: per 32 values, d * (q - 8), d in float16."""
    groups = weight.float().view(weight.shape[0], -1, 32)
    scales = (groups.abs().amax(-1) / 8).half().float()
    codes = (groups / scales[..., None]).round().clamp(-8, 7) + 8
    return GroupCodes(codes.to(torch.uint8), scales, scales * -8)


def _tied_head(codes: GroupCodes) -> LMHead:
    """A head tied to a 512 x 128 embedding loaded from `codes`, its methods chosen."""
    embedding = VocabEmbedding(512, 128)
    embedding.weight.data = torch.empty(512, 128, dtype=torch.bfloat16)  # as models allocate
    default_weight_loader(embedding.weight, codes)
    head = LMHead(512, 128, tie_to=embedding)
    head.process_weights_after_loading("int4", keep_dense=True)
    return head


def test_head_ranks_on_a_tied_q4_0_embeddings_own_codes():
    """A tied embedding stored as Q4_0 (Qwen3's GGUF files) shortlists on its own codes:
    exactly the file's values, at Q4_0's 0.5625 bytes a weight, not a requantized copy."""
    weight = torch.randn(512, 128, generator=torch.Generator().manual_seed(9)) / 10
    codes = _q4_0_codes(weight)
    head = _tied_head(codes)
    shortlist = head.shortlist.base_method()
    assert isinstance(shortlist, W4A8Weight) and shortlist.symmetric
    assert shortlist.nbytes() == 512 * 128 * 9 // 16
    assert torch.equal(shortlist.dense(torch.float32), codes.dense(torch.float32))
    assert isinstance(head.method.base_method(), W8A8Weight)  # logits stay 8-bit


def test_head_requantizes_4_bit_codes_whose_scales_are_not_float16():
    """Codes with float32 scales (Q4_K's sub-blocks) would rank at 0.75 bytes a weight:
    the shortlist requantizes the dense weight with float16 d and m instead (0.625)."""
    weight = torch.randn(512, 128, generator=torch.Generator().manual_seed(10)) / 10
    head = _tied_head(_q4_1_codes(weight))  # float32 scales, as Q4_K's decode to
    shortlist = head.shortlist.base_method()
    assert isinstance(shortlist, W4A8Weight) and shortlist.scales_and_mins.dtype == torch.float16
    assert shortlist.nbytes() == 512 * 128 * 5 // 8


@pytest.mark.parametrize("from_codes", [False, True])
def test_linear_keeps_dense_weights_where_they_win_large_steps(
    dense_from_tokens, bf16_panels, from_codes
):
    """With a crossover (CPUs with matrix units), steps below it run W4A8 and larger ones the
    kept dense weight (torch's here: no panels), which for file codes is their exact
    dequantization."""
    dense_from_tokens("16")
    bf16_panels("never")
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    linear = Linear(64, 48)
    if from_codes:
        linear.weight.data = torch.empty(48, 64, dtype=torch.bfloat16)  # as models allocate
        codes = _q4_1_codes(weight)
        linear.weight_loader(linear.weight, codes)
        want_dense = codes.dense(torch.bfloat16)
    else:
        linear.weight.data = weight.clone()
        want_dense = weight
    linear.process_weights_after_loading("int4", keep_dense=True)
    assert isinstance(linear.method, CrossoverMethod) and linear.method.max_tokens == 15
    assert isinstance(linear.quantized, W4A8Weight) and linear.keeps_dense
    small, large = torch.randn(15, 64).bfloat16(), torch.randn(16, 64).bfloat16()
    assert torch.equal(linear(small), linear.quantized.matmul(small))
    torch.testing.assert_close(
        linear(large), torch.nn.functional.linear(large, want_dense), atol=0, rtol=0
    )


def test_linear_drops_dense_weights_without_keep_dense(dense_from_tokens):
    dense_from_tokens("16")
    linear = Linear(64, 48)
    linear.weight.data = torch.randn(48, 64).bfloat16()
    linear.process_weights_after_loading("int4", keep_dense=False)
    assert isinstance(linear.method, W4A8Weight) and linear.weight.numel() == 0


def test_head_uses_its_dense_weight_for_large_steps_where_that_wins(dense_from_tokens):
    dense_from_tokens("8")
    head = _head(keep_dense=True)
    assert isinstance(head.method, CrossoverMethod) and head.method.max_tokens == 7
    assert isinstance(head.shortlist, CrossoverMethod) and head.shortlist.max_tokens == 7
    hidden = torch.randn(8, 128, generator=torch.Generator().manual_seed(8)).bfloat16()
    dense = torch.nn.functional.linear(hidden, head.weight).float()
    exact = hidden.float() @ head.weight.float().T
    for ranking_only in (False, True):
        logits = head(hidden, ranking_only)
        assert torch.equal(logits.argmax(-1), exact.argmax(-1))
        # The dense bf16 logits, but for the top candidates refined in float32.
        assert (logits != dense).sum(-1).max() <= REFINED_CANDIDATES
    # Seven tokens are below the crossover: W8A8 logits, off the dense ones almost everywhere.
    assert (head(hidden[:7]) != dense[:7]).sum(-1).min() > REFINED_CANDIDATES


def _q8_0_codes(weight: torch.Tensor) -> GroupCodes:
    """`weight` as a Q8_0 file would store it: per 32 values, d * q, q in -127..127."""
    groups = weight.float().view(weight.shape[0], -1, 32)
    scales = groups.abs().amax(-1) / 127
    codes = (groups / scales[..., None]).round().clamp(-127, 127)
    return GroupCodes(codes.to(torch.int8), scales, None)


def test_q8_0_codes_stay_codes_under_the_int8_method():
    """A Q8_0 file is served with the int8 method: its codes become W8A8 as they are, not
    dequantized and re-quantized per channel (which would change its numbers)."""
    from types import SimpleNamespace

    from pagedllm.model_loader import loader

    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(9)).bfloat16()
    codes = _q8_0_codes(weight)
    linear = Linear(64, 48)
    linear.weight.data = torch.empty(48, 64, dtype=torch.bfloat16)
    linear.weight_loader(linear.weight, codes)
    linear.process_weights_after_loading("int8", keep_dense=False)
    assert isinstance(linear.quantized, W8A8Weight)
    assert torch.equal(linear.quantized.dense(torch.float32), codes.dense(torch.float32))
    # The loader asks for the codes under both methods.
    for method in ("int4", "int8"):
        config = SimpleNamespace(quantization=method)
        assert loader._keeps_file_codes(config, torch.bfloat16, "cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("keep_dense", [False, True])
@pytest.mark.parametrize("num_rows", [1, 9])
def test_greedy_tokens_are_the_argmax_of_the_ranking_logits(keep_dense, num_rows):
    """The greedy shortcut picks what argmax over forward(ranking_only=True) picks, without
    the [N, vocab] float32 logits; with float32 weights it is the plain argmax."""
    hidden = torch.randn(num_rows, 128, generator=torch.Generator().manual_seed(11))
    for dtype in (torch.bfloat16, torch.float32):
        head = _head(keep_dense, dtype)
        rows = hidden.to(dtype)
        expected = head(rows, ranking_only=True).argmax(-1)
        assert torch.equal(head.greedy_tokens(rows), expected)
