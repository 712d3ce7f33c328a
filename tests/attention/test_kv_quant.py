"""The int8 KV cache: its row format, its writers (torch and C) and attention over it.

Attention over an int8 cache must equal dense attention over the round-tripped K/V (what
the cache gives back), for every batch shape and on both decode paths; both writers must
produce the same bytes.
"""

from __future__ import annotations

import pytest
import torch

from pagedllm.attention import cpu_kernel, kv_quant
from pagedllm.attention.torch_paged import TorchPagedBackend

from .test_torch_paged import BATCHES, KERNELS, _Case, make_backend, make_common_metadata


def test_row_format_is_codes_then_a_float32_scale_per_16() -> None:
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([0.5, -1.27, 0.0, 1.0])
    x[0, 16] = 20.0  # the second group's scale is its own
    x[0, 17] = 10.0
    rows = kv_quant.quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (1, 32 + 2 * kv_quant.SCALE_BYTES)
    assert rows.shape[-1] == kv_quant.cache_row_size(32)
    assert rows[0, :4].tolist() == [50, -127, 0, 100]
    assert rows[0, 16:18].tolist() == [127, 64]
    scales = rows[0, 32:].contiguous().view(torch.float32).tolist()
    assert scales == pytest.approx([1.27 / 127, 20 / 127])


def test_head_sizes_must_be_whole_groups() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        kv_quant.cache_row_size(40)


def test_round_trip_error_is_at_most_half_a_step_per_group() -> None:
    x = torch.randn(64, 3, 64, generator=torch.Generator().manual_seed(0)) * 5
    back = kv_quant.round_trip(x)
    groups = x.unflatten(-1, (4, 16))
    step = groups.abs().amax(dim=-1, keepdim=True) / 127
    assert ((back.unflatten(-1, (4, 16)) - groups).abs() <= step / 2 + 1e-6).all()
    # each group's largest value survives up to float rounding
    torch.testing.assert_close(
        back.unflatten(-1, (4, 16)).abs().amax(-1), groups.abs().amax(-1), atol=0, rtol=1e-6
    )


def test_zero_rows_stay_zero() -> None:
    rows = kv_quant.quantize_rows(torch.zeros(2, 16))
    assert torch.equal(rows, torch.zeros_like(rows))
    assert torch.equal(kv_quant.dequantize_rows(rows, torch.float32), torch.zeros(2, 16))


@pytest.mark.skipif(not cpu_kernel.can_store_int8(torch.float32), reason="no C compiler")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_writer_writes_the_torch_rows(dtype: torch.dtype) -> None:
    """Same bytes from both writers, for strided K/V views as the model passes them."""
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, kv_heads, head_size, tokens = 6, 4, 3, 64, 9
    qkv = (torch.randn(tokens, 5 * kv_heads * head_size, generator=gen) * 3).to(dtype)
    key = qkv[:, : kv_heads * head_size].view(tokens, kv_heads, head_size)
    value = qkv[:, 2 * kv_heads * head_size : 3 * kv_heads * head_size].view(
        tokens, kv_heads, head_size
    )
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    shape = TorchPagedBackend.get_kv_cache_shape(
        num_blocks, block_size, kv_heads, head_size, "int8"
    )
    cache = torch.zeros(shape, dtype=torch.int8)
    cpu_kernel.store_int8(cache, key, value, slots)
    flat = cache.view(2, -1, kv_heads, shape[-1])
    assert torch.equal(flat[0, slots], kv_quant.quantize_rows(key))
    assert torch.equal(flat[1, slots], kv_quant.quantize_rows(value))
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots] = False
    assert not flat[:, untouched].any()
    # write_back: the inputs become what the cache gives back, in place.
    expected_key, expected_value = kv_quant.round_trip(key), kv_quant.round_trip(value)
    out_key, out_value = cpu_kernel.store_int8(cache, key, value, slots, write_back=True)
    assert out_key.data_ptr() == key.data_ptr() and out_value.data_ptr() == value.data_ptr()
    assert torch.equal(key, expected_key) and torch.equal(value, expected_value)


def _int8_case(batch: str, block_size: int, heads: tuple[int, int], head_size: int) -> _Case:
    """A case whose full K/V are already round-tripped and whose cache is int8."""
    case = _Case(BATCHES[batch], block_size, *heads, head_size=head_size)
    case.full_kv = [kv_quant.round_trip(kv) for kv in case.full_kv]
    case.cache = kv_quant.quantize_rows(case.cache)
    return case


@pytest.mark.parametrize("use_cpu_kernel", KERNELS)
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("heads", [(6, 2), (3, 3)])
def test_attention_over_int8_cache_matches_dense_over_round_trip(
    block_size: int, batch: str, heads: tuple[int, int], use_cpu_kernel: bool
) -> None:
    case = _int8_case(batch, block_size, heads, head_size=64)
    backend = make_backend(use_cpu_kernel)
    metadata = backend.build_metadata(make_common_metadata(case.requests, block_size), block_size)
    before = case.cache.clone()
    out = backend.forward(case.query, case.key, case.value, case.cache, metadata, 0.125)
    torch.testing.assert_close(out, case.expected(0.125), atol=2e-5, rtol=1e-5)
    # The new tokens were written as int8 rows; nothing else changed.
    expected_cache = before
    for kv, (context_len, _, block_ids) in zip(case.full_kv, case.requests, strict=True):
        for pos in range(context_len, kv.shape[1]):
            block, offset = block_ids[pos // block_size], pos % block_size
            expected_cache[:, block, offset] = case.cache[:, block, offset]
    assert torch.equal(case.cache, expected_cache)
    pairs = zip(case.full_kv, case.requests, strict=True)
    new_keys = torch.cat([kv[0, context_len:] for kv, (context_len, _, _) in pairs])
    flat = case.cache.view(2, -1, heads[1], kv_quant.cache_row_size(64))
    written = kv_quant.dequantize_rows(flat[0, metadata.slot_mapping], torch.float32)
    torch.testing.assert_close(written, new_keys, atol=0, rtol=0)


@pytest.mark.parametrize("use_cpu_kernel", KERNELS)
def test_bfloat16_queries_over_int8_cache(use_cpu_kernel: bool) -> None:
    """The bf16 model path: within bf16 rounding of float32 attention over the same cache."""
    case = _int8_case("mixed", 16, (9, 3), head_size=64)
    backend = make_backend(use_cpu_kernel)
    metadata = backend.build_metadata(make_common_metadata(case.requests, 16), 16)
    out = backend.forward(
        case.query.bfloat16(), case.key.bfloat16(), case.value.bfloat16(), case.cache,
        metadata, 0.125,
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), case.expected(0.125), atol=3e-2, rtol=3e-2)


def test_int8_attention_is_close_to_unquantized() -> None:
    """The cost of the format itself: a small fraction of the attention output's scale."""
    case = _Case(BATCHES["mixed"], 16, 6, 2, head_size=64)
    exact = case.expected(0.125)
    quantized = _int8_case("mixed", 16, (6, 2), head_size=64).expected(0.125)
    assert (quantized - exact).abs().max() < 0.02 * exact.abs().max()


def test_codes_round_as_a_true_division_does() -> None:
    """-2.9375 * (127 / 5.875) is exactly -63.5, which rounds to even (-64); with 127 times
    a rounded reciprocal of 5.875 the product is just above it and rounds to -63."""
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 5.875, -2.9375
    assert kv_quant.quantize_rows(x)[0, :2].tolist() == [127, -64]


def test_rows_convert_between_cache_dtypes_as_a_peer_needs() -> None:
    # A KV connector's peer may keep another cache dtype: int8 rows become the values they
    # stand for, values become the rows this writer would store.
    values = torch.randn(3, 2, 64)
    rows = kv_quant.quantize_rows(values)
    assert kv_quant.convert_rows(rows, torch.int8) is rows
    assert torch.equal(kv_quant.convert_rows(rows, torch.float32),
                       kv_quant.dequantize_rows(rows, torch.float32))
    as_bf16 = kv_quant.convert_rows(rows, torch.bfloat16)
    assert as_bf16.dtype == torch.bfloat16 and as_bf16.shape == values.shape
    assert torch.equal(kv_quant.convert_rows(values, torch.int8), rows)
    back = kv_quant.convert_rows(values.bfloat16(), torch.int8)
    assert torch.equal(back, kv_quant.quantize_rows(values.bfloat16().float()))
    assert torch.equal(kv_quant.convert_rows(values, torch.bfloat16), values.bfloat16())
