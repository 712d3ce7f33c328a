"""Every kernel variant this host can execute, against the scalar reference (csrc/scalar.c).

The byte dot products (W4A8, W8A8) must be bit-identical on every ISA: isa.h fixes the
order of every float operation and the integer sums are exact. Attention and the fused
element-wise ops share their loops across variants (only the compiler's vectorization
differs), so they agree to float32 rounding. An AVX-512 host runs its AVX2 variants too;
the Arm variants run under qemu (test_arm_qemu.py).
"""

from __future__ import annotations

import pytest
import torch

from pagedllm import kernels
from pagedllm.attention import cpu_kernel
from pagedllm.kernels import build
from pagedllm.kernels.variants import runnable_variants
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import (
    GroupCodes,
    W4A8Weight,
    quantize_w4a8,
    quantize_w8a8,
    w4a8_from_codes,
)
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect

pytestmark = pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
HOST_VARIANTS = [v.name for v in runnable_variants(detect()) if v.name != "scalar"]


@pytest.fixture(scope="module")
def libraries() -> dict[str, kernels.KernelLibrary]:
    return {name: kernels.load_variant(name) for name in ["scalar", *HOST_VARIANTS]}


def quantize_q4_1(weight: torch.Tensor) -> W4A8Weight:
    """Random Q4_1-like codes (float16 scales and minimums, as GGUF stores them) at
    `weight`'s shape: a W4A8Weight with float16 scales."""
    rows, cols = weight.shape
    gen = torch.Generator().manual_seed(rows * cols)
    codes = torch.randint(0, 16, (rows, cols // 32, 32), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(rows, cols // 32, generator=gen) * 0.05).half().float()
    mins = (torch.randn(rows, cols // 32, generator=gen) * 0.2).half().float()
    packed = w4a8_from_codes(GroupCodes(codes, scales, mins))
    assert isinstance(packed, W4A8Weight) and packed.scales_and_mins.dtype == torch.float16
    return packed


def quantize_q4_0(weight: torch.Tensor) -> W4A8Weight:
    """Random Q4_0-like codes (a float16 scale, minimum -8 d) at `weight`'s shape: a
    W4A8Weight holding its scales alone."""
    rows, cols = weight.shape
    gen = torch.Generator().manual_seed(rows + cols)
    codes = torch.randint(0, 16, (rows, cols // 32, 32), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(rows, cols // 32, generator=gen) * 0.05).half().float()
    packed = w4a8_from_codes(GroupCodes(codes, scales, -8 * scales))
    assert isinstance(packed, W4A8Weight) and packed.symmetric
    return packed


def _run(libraries, name, fn):
    with cpu_platform().use_kernels(libraries[name]):
        return fn()


def test_each_library_reports_its_variant(libraries):
    for name, library in libraries.items():
        assert library.isa == name


def test_only_the_amx_variant_multiplies_on_matrix_units(libraries):
    """amx_bf16 runs dense bfloat16 matmuls on AMX's tiles (where Linux grants them: 5.16+);
    every other variant has none."""
    for name, library in libraries.items():
        units = bool(library.lib.bf16_matrix_units())
        if name != "amx_bf16":
            assert not units, name
        elif not units:
            pytest.skip("Linux refused AMX's tiles here (a kernel before 5.16, a VM)")


def test_host_runs_its_best_variant_and_the_ones_below():
    names = [v.name for v in runnable_variants(detect())]
    assert names[-1] == "scalar"
    if "avx512" in names:  # an AVX-512 host checks the AVX2 variant as well
        assert "avx2" in names


@pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no vector variant here")
@pytest.mark.parametrize("variant", HOST_VARIANTS)
@pytest.mark.parametrize("quantizer", [quantize_w4a8, quantize_w8a8, quantize_q4_1,
                                       quantize_q4_0], ids=["w4a8", "w8a8", "w4a8-f16",
                                                            "w4a8-sym-f16"])
@pytest.mark.parametrize(("rows", "cols"), [(130, 64), (48, 96), (256, 576)])
def test_byte_dot_products_are_bit_identical_to_scalar(libraries, variant, quantizer, rows, cols):
    gen = torch.Generator().manual_seed(rows + cols)
    weight = quantizer(torch.randn(rows, cols, generator=gen).bfloat16())
    for num_tokens in (1, 3, 4, 5, 8, 9, 17):
        x = (torch.randn(num_tokens, cols, generator=gen) * 3).bfloat16()
        x[0, :32] = 0  # a group of zeros: step 0, codes 0
        x[-1, 32:64] *= 1000  # a group with a wide range
        want = _run(libraries, "scalar", lambda: weight.matmul(x))  # noqa: B023
        got = _run(libraries, variant, lambda: weight.matmul(x))  # noqa: B023
        assert torch.equal(got, want), (variant, num_tokens)


def _paged_inputs(dtype: torch.dtype, cache_dtype: torch.dtype, gen: torch.Generator):
    """A cache of 40 blocks of 16, 9 query heads on 3 kv heads of 64, three requests."""
    num_blocks, block_size, kv_heads, head_size = 40, 16, 3, 64
    if cache_dtype == torch.int8:
        rows = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen)
        from pagedllm.attention.kv_quant import quantize_rows

        cache = quantize_rows(rows)
    else:
        cache = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen)
        cache = cache.to(cache_dtype)
    cache[:, 0] = 0
    lengths = [70, 1, 33]
    tables = torch.zeros(3, 5, dtype=torch.int32)
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    for r, length in enumerate(lengths):
        for b in range(-(-length // block_size)):
            tables[r, b] = order.pop()
    return cache, tables, torch.tensor(lengths, dtype=torch.int32)


def _assert_attention_matches_scalar(libraries, variant, attend, dtype) -> None:
    """`attend()` on `variant` equals it on scalar up to libm's expf (and bf16 rounding)."""
    want = _run(libraries, "scalar", attend).float()
    got = _run(libraries, variant, attend).float()
    tolerance = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("variant", HOST_VARIANTS)
@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
     (torch.float32, torch.int8), (torch.bfloat16, torch.int8)],
)
def test_decode_attention_matches_scalar(libraries, variant, dtype, cache_dtype):
    gen = torch.Generator().manual_seed(1)
    cache, tables, seq_lens = _paged_inputs(dtype, cache_dtype, gen)
    query = torch.randn(3, 9, 64, generator=gen).to(dtype)
    rows = torch.arange(3, dtype=torch.int32)

    def decode() -> torch.Tensor:
        out = torch.zeros_like(query)
        cpu_kernel.paged_decode_attention(out, query, cache, tables, seq_lens, rows, 70, 0.125)
        return out

    _assert_attention_matches_scalar(libraries, variant, decode, dtype)


@pytest.mark.parametrize("variant", HOST_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_matches_scalar(libraries, variant, dtype):
    """Three requests: 70 new tokens, 1 after a context of 0, 13 after a context of 20 (rows
    not a multiple of 4, partial key tiles)."""
    gen = torch.Generator().manual_seed(2)
    cache, tables, _ = _paged_inputs(dtype, dtype, gen)
    query_lens = torch.tensor([70, 1, 13], dtype=torch.int32)
    context_lens = torch.tensor([0, 0, 20], dtype=torch.int32)
    starts = torch.tensor([0, 70, 71], dtype=torch.int32)
    query = torch.randn(84, 9, 64, generator=gen).to(dtype)

    def prefill() -> torch.Tensor:
        out = torch.zeros_like(query)
        cpu_kernel.paged_prefill_attention(
            out, query, cache, tables, starts, query_lens, context_lens, 70, 0.125
        )
        return out

    _assert_attention_matches_scalar(libraries, variant, prefill, dtype)


@pytest.mark.parametrize("variant", HOST_VARIANTS)
def test_fused_ops_match_scalar(libraries, variant):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(37, 576, generator=gen).bfloat16()
    weight = (torch.rand(576, generator=gen) + 0.5).bfloat16()
    residual = torch.randn(37, 576, generator=gen)
    gate_up = torch.randn(37, 2 * 384, generator=gen).bfloat16()
    positions = torch.randint(0, 100, (37,), generator=gen)
    cos_sin = torch.randn(100, 64, generator=gen)

    def ops() -> list[torch.Tensor]:
        normed, new_residual = cpu_ops.add_rms_norm(x, residual.clone(), weight, 1e-5)
        layer_normed, _ = cpu_ops.add_layer_norm(x, residual.clone(), weight, weight, 1e-5)
        rotated = x.clone()
        cpu_ops.rope_neox_(rotated, positions, cos_sin, 64)
        return [normed, new_residual, layer_normed, cpu_ops.silu_and_mul(gate_up),
                cpu_ops.gelu_tanh_and_mul(gate_up), cpu_ops.activation("gelu_tanh", x),
                cpu_ops.activation("relu", x), cpu_ops.quick_gelu(x), rotated]

    reference = _run(libraries, "scalar", ops)
    for got, want in zip(_run(libraries, variant, ops), reference, strict=True):
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)


def _lora_delta(num_tokens: int) -> torch.Tensor:
    """A fused qkv layer's output plus its tokens' deltas from three adapters (csrc/lora.c),
    with the kernel library current at the call."""
    from pagedllm.lora.layers import LoRABatch, LoRALinearSlots
    from pagedllm.lora.peft_adapter import LoRAModuleWeights

    gen = torch.Generator().manual_seed(num_tokens)
    sizes = [96, 32, 32]
    batch = LoRABatch(max_loras=3)
    slots = LoRALinearSlots(64, sizes, 3, 8, batch, torch.bfloat16, torch.device("cpu"))
    assert slots.kernel is not None
    for slot, rank in enumerate((8, 3, 5)):
        slots.set_slot(slot, [LoRAModuleWeights(torch.randn(rank, 64, generator=gen),
                                                 torch.randn(size, rank, generator=gen), 0.5)
                              for size in sizes])
    batch.set_token_slots(torch.randint(-1, 3, (num_tokens,), generator=gen))
    x = torch.randn(num_tokens, 64, generator=gen).bfloat16()
    out = torch.randn(num_tokens, sum(sizes), generator=gen).bfloat16()
    return slots.apply(x, out)


@pytest.mark.parametrize("variant", HOST_VARIANTS)
def test_lora_deltas_match_scalar(libraries, variant):
    for num_tokens in (1, 5, 17, 40):
        want = _run(libraries, "scalar", lambda: _lora_delta(num_tokens))  # noqa: B023
        got = _run(libraries, variant, lambda: _lora_delta(num_tokens))  # noqa: B023
        # float32 sums in the compiler's vector order: at most one bfloat16 rounding apart.
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-2)


# float32 NaNs whose bit patterns sit where a round-to-nearest-even add could carry out of
# the exponent: the largest payloads (either sign) and the smallest.
NAN_BITS = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FFF8000, 0x7F800001, 0x7FC00000]


@pytest.mark.parametrize("variant", ["scalar", *HOST_VARIANTS])
def test_a_nan_stays_a_nan_in_bfloat16(libraries, variant):
    """Every float32 NaN rounds to a bfloat16 NaN: a NaN in the float32 residual stream
    must reach the normed row (the engine's non-finite checks read the bfloat16 rows), not
    turn into a zero or an infinity on the way."""
    gen = torch.Generator().manual_seed(5)
    num_rows = len(NAN_BITS) + 1
    x = torch.randn(num_rows, 576, generator=gen).bfloat16()
    weight = (torch.rand(576, generator=gen) + 0.5).bfloat16()
    residual = torch.randn(num_rows, 576, generator=gen)
    bits = residual.view(torch.int32)
    for row, nan in enumerate(NAN_BITS):
        bits[row, 7] = torch.tensor(nan, dtype=torch.int64).to(torch.int32)  # wraps

    def ops() -> list[torch.Tensor]:
        rms, _ = cpu_ops.add_rms_norm(x, residual.clone(), weight, 1e-5)
        layer, _ = cpu_ops.add_layer_norm(x, residual.clone(), weight, weight, 1e-5)
        return [rms, layer]

    for normed in _run(libraries, variant, ops):
        assert normed[:-1].float().isnan().all(), variant  # every value of those rows
        assert normed[-1].float().isfinite().all(), variant
