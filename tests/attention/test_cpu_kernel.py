"""The C decode kernel: switched off on request, and exact on long GQA contexts."""

from __future__ import annotations

import pytest
import torch

from pagedllm.attention import cpu_kernel, kv_quant
from pagedllm.attention.cpu_paged import CpuPagedMetadata
from pagedllm.attention.registry import backend_name_for_device
from pagedllm.kernels import load_variant
from pagedllm.kernels.variants import runnable_variants
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect

from .test_torch_paged import make_backend, make_common_metadata

needs_kernel = pytest.mark.skipif(
    not cpu_kernel.is_available(torch.float32), reason="no C compiler to build the kernel"
)


def test_environment_switches_the_kernel_off(monkeypatch):
    monkeypatch.setenv("PAGEDLLM_ATTENTION_KERNEL", "torch")
    assert not cpu_kernel.is_available(torch.float32)
    assert backend_name_for_device("cpu", torch.float32) == "torch_grouped"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# the kernel's sizes, then any: 48 (whole AVX-512 vectors), 40 (a tail shorter than an
# AVX-512 vector), 36 (shorter than an AVX2 or NEON vector too)
@pytest.mark.parametrize("head_size", [64, 128, 256, 48, 40, 36])
# query heads per kv head: SmolLM2's 3, then 8, 5 and 6 (more rows than one register block,
# and remainders of 1 and 2 rows)
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 1), (10, 2), (12, 2)])
def test_long_gqa_decodes_match_torch_path(dtype, head_size, heads, kv_heads):
    """Grouped query heads on their kv heads, contexts of several blocks."""
    gen = torch.Generator().manual_seed(0)
    block_size, num_blocks = 16, 80
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=gen)
    cache[:, 0] = 0
    cache = cache.to(dtype)
    lengths = [300, 17, 1, 160]
    order = torch.randperm(num_blocks - 1, generator=gen) + 1
    requests, used = [], 0
    for length in lengths:
        count = (length + block_size) // block_size
        requests.append((length, 1, order[used : used + count].tolist()))
        used += count
    common = make_common_metadata(requests, block_size)
    query = torch.randn(len(lengths), heads, head_size, generator=gen).to(dtype)
    key = torch.randn(len(lengths), kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(len(lengths), kv_heads, head_size, generator=gen).to(dtype)
    outs = []
    for use_kernel in (True, False):
        backend = make_backend(use_kernel)
        metadata = backend.build_metadata(common, block_size)
        assert isinstance(metadata, CpuPagedMetadata) == (use_kernel is True)
        outs.append(backend.forward(query, key, value, cache.clone(), metadata, 0.125))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=tolerance, rtol=tolerance)


def _random_step(gen, requests, block_size, kv_heads, head_size, heads, cache_dtype, dtype):
    """A cache with random contexts and one step's new q/k/v for (context, query) requests."""
    num_blocks = sum((c + q) // block_size + 1 for c, q in requests) + 1
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    specs, used = [], 0
    for context, query_len in requests:
        count = (context + query_len) // block_size + 1
        specs.append((context, query_len, order[used : used + count]))
        used += count
    common = make_common_metadata(specs, block_size)
    row = kv_quant.cache_row_size(head_size) if cache_dtype == torch.int8 else head_size
    cache = torch.zeros(2, num_blocks, block_size, kv_heads, row, dtype=cache_dtype)
    if cache_dtype == torch.int8:  # random contexts, written as the engine writes them
        past = torch.randn(2, num_blocks * block_size, kv_heads, head_size, generator=gen)
        slots = torch.arange(block_size, num_blocks * block_size)
        cpu_kernel.store_int8(cache, past[0, slots].to(dtype), past[1, slots].to(dtype), slots)
    else:
        cache[:, 1:] = torch.randn(cache[:, 1:].shape, generator=gen).to(cache_dtype)
    tokens = common.num_tokens
    new = [torch.randn(tokens, n, head_size, generator=gen).to(dtype) for n in (heads, kv_heads)]
    value = torch.randn(tokens, kv_heads, head_size, generator=gen).to(dtype)
    return common, cache, new[0], new[1], value


@needs_kernel
@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.int8),
        (torch.float32, torch.int8),
    ],
)
@pytest.mark.parametrize("head_size", [64, 40])  # 40: the kernel's portable inner loops
@pytest.mark.parametrize("window", [None, 23])
def test_prefill_kernel_matches_torch_path(dtype, cache_dtype, head_size, window):
    """Prefills with and without cached context, beside decodes: the same attention as the
    torch path (padded groups over gathered contexts), to float rounding; also with a
    sliding window shorter than most contexts."""
    if cache_dtype == torch.int8 and head_size % kv_quant.GROUP:
        pytest.skip("the int8 cache takes head sizes of whole 16-value groups")
    gen = torch.Generator().manual_seed(head_size)
    block_size, heads, kv_heads = 16, 9, 3
    requests = [(0, 37), (20, 5), (50, 1), (3, 70), (0, 1), (129, 33)]
    common, cache, query, key, value = _random_step(
        gen, requests, block_size, kv_heads, head_size, heads, cache_dtype, dtype
    )
    outs = []
    for use_kernel in (True, False):
        backend = make_backend(use_kernel)
        metadata = backend.build_metadata(common, block_size)
        assert isinstance(metadata, CpuPagedMetadata) == (use_kernel is True)
        outs.append(
            backend.forward(
                query, key.clone(), value.clone(), cache.clone(), metadata, 0.125, window
            )
        )
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=tolerance, rtol=tolerance)


@needs_kernel
def test_a_cache_of_another_row_size_is_refused():
    """The C kernels size rows from the head size; a mismatched cache is a ValueError, not
    an out-of-bounds write (a cache made for the old one-scale-per-row int8 format)."""
    cache = torch.zeros(2, 4, 16, 3, 64 + 4, dtype=torch.int8)
    key = torch.randn(2, 3, 64)
    with pytest.raises(ValueError, match="do not hold head size 64"):
        cpu_kernel.store_int8(cache, key, key.clone(), torch.tensor([17, 18]))


# (kv heads, query heads, head size): SmolLM2's, whose partitions hold at least 256
# positions, and Qwen3-0.6B's, whose 8 x 128 values a position make that 48.
HEAD_SHAPES = [pytest.param((3, 9, 64), id="smollm2"), pytest.param((8, 16, 128), id="qwen3")]


@needs_kernel
@pytest.mark.parametrize("shape", HEAD_SHAPES)
@pytest.mark.parametrize("window", [None, 300])
def test_long_contexts_are_attended_in_partitions_exactly(window, shape):
    """Contexts of several partitions (the kernel splits a context of n positions into
    parts of ceil(n / 8), at least 256 x 3 x 64 values of K, merged by their softmax
    statistics): float32 output equals a float64 reference, with and without a window."""
    gen = torch.Generator().manual_seed(7)
    block_size, (kv_heads, heads, head_size) = 16, shape
    lengths = [2000, 700, 257, 256, 100, 49, 48, 5]
    blocks = [-(-n // block_size) for n in lengths]
    cache = torch.randn(2, sum(blocks) + 1, block_size, kv_heads, head_size, generator=gen)
    order = (torch.randperm(sum(blocks), generator=gen) + 1).int()
    tables = torch.zeros(len(lengths), max(blocks), dtype=torch.int32)
    start = 0
    for r, count in enumerate(blocks):
        tables[r, :count] = order[start : start + count]
        start += count
    query = torch.randn(len(lengths), heads, head_size, generator=gen)
    out = torch.zeros_like(query)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    cpu_kernel.paged_decode_attention(
        out, query, cache, tables, seq_lens, torch.arange(len(lengths), dtype=torch.int32),
        max(lengths), head_size**-0.5, window,
    )
    for r, n in enumerate(lengths):
        slots = (tables[r].long()[:, None] * block_size + torch.arange(block_size)).flatten()
        lo = n - window if window is not None and n > window else 0
        keys, values = (cache[i].reshape(-1, kv_heads, head_size)[slots[lo:n]].double()
                        for i in (0, 1))
        q = query[r].double().view(kv_heads, heads // kv_heads, head_size)
        scores = torch.einsum("ghd,pgd->ghp", q, keys) * head_size**-0.5
        want = torch.einsum("ghp,pgd->ghd", scores.softmax(-1), values).reshape(heads, -1)
        torch.testing.assert_close(out[r].double(), want, atol=2e-6, rtol=2e-6)


@needs_kernel
@pytest.mark.parametrize("shape", HEAD_SHAPES)
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.int8])
@pytest.mark.parametrize("length", [100, 700])
def test_a_decode_alone_equals_it_in_a_large_batch(cache_dtype, length, shape):
    """A request's decode attention is bit-identical alone and among 40 others (the batch
    never changes a result: a kernel that splits its work by the batch's size, e.g. a
    single stream's heads over the threads, must keep this)."""
    gen = torch.Generator().manual_seed(4)
    block_size, (kv_heads, heads, head_size), num_reqs = 16, shape, 40
    blocks_each = -(-length // block_size)
    rows = torch.randn(2, num_reqs * blocks_each + 1, block_size, kv_heads, head_size,
                       generator=gen)
    cache = kv_quant.quantize_rows(rows) if cache_dtype == torch.int8 else rows.bfloat16()
    order = torch.randperm(num_reqs * blocks_each, generator=gen).int() + 1
    tables = order.view(num_reqs, blocks_each).contiguous()
    seq_lens = torch.full((num_reqs,), length, dtype=torch.int32)
    query = torch.randn(num_reqs, heads, head_size, generator=gen).bfloat16()

    def attend(index: slice) -> torch.Tensor:
        count = len(range(num_reqs)[index])
        out = torch.zeros(count, heads, head_size, dtype=torch.bfloat16)
        cpu_kernel.paged_decode_attention(
            out, query[index].contiguous(), cache, tables[index].contiguous(),
            seq_lens[index].contiguous(), torch.arange(count, dtype=torch.int32), length,
            head_size**-0.5,
        )
        return out

    batched = attend(slice(None))
    for r in (0, 17, num_reqs - 1):
        assert torch.equal(attend(slice(r, r + 1))[0], batched[r])


def _prefill(cache, tables, chunks, head_size, window=None):
    """paged_prefill_attention over `chunks` [(table row, context, query rows)], each its
    own request of one call."""
    rows = torch.cat([q for _, _, q in chunks]).contiguous()
    out = torch.zeros_like(rows)
    lens = [q.shape[0] for _, _, q in chunks]
    starts = torch.tensor([0, *lens[:-1]], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cpu_kernel.paged_prefill_attention(
        out, rows, cache, torch.stack([tables[r] for r, _, _ in chunks]).contiguous(),
        starts, torch.tensor(lens, dtype=torch.int32),
        torch.tensor([c for _, c, _ in chunks], dtype=torch.int32),
        max(c + q.shape[0] for _, c, q in chunks), head_size**-0.5, window,
    )
    return out


@needs_kernel
@pytest.mark.parametrize("shape", HEAD_SHAPES)
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.int8])
def test_a_prompts_prefill_rows_do_not_depend_on_chunks_or_batch(cache_dtype, window, shape):
    """bfloat16 queries' prefill (on AMX's tiles where the library has them): each query
    row is bit-identical prefilled whole, in chunks of any size, or beside other requests;
    and close to a float64 reference over the cache's values (bfloat16 output rounding)."""
    gen = torch.Generator().manual_seed(11)
    block_size, (kv_heads, heads, head_size) = 16, shape
    lengths = [150, 37]
    blocks = [-(-n // block_size) for n in lengths]
    rows = torch.randn(2, sum(blocks) + 1, block_size, kv_heads, head_size, generator=gen)
    if cache_dtype == torch.int8:
        cache = kv_quant.quantize_rows(rows)
        exact = kv_quant.dequantize_rows(cache, torch.float32)
    else:
        cache = exact = rows.bfloat16()
    order = (torch.randperm(sum(blocks), generator=gen) + 1).int()
    tables = torch.zeros(len(lengths), max(blocks), dtype=torch.int32)
    tables[0, : blocks[0]], tables[1, : blocks[1]] = order[: blocks[0]], order[blocks[0] :]
    query = torch.randn(lengths[0], heads, head_size, generator=gen).bfloat16()
    whole = _prefill(cache, tables, [(0, 0, query)], head_size, window)
    for cuts in ([0, 1, 17, 50, 150], [0, 64, 70, 150], [0, 149, 150]):
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            chunk = _prefill(cache, tables, [(0, lo, query[lo:hi])], head_size, window)
            assert torch.equal(chunk, whole[lo:hi]), (cuts, lo)
    other = torch.randn(lengths[1], heads, head_size, generator=gen).bfloat16()
    both = _prefill(cache, tables, [(1, 0, other), (0, 0, query)], head_size, window)
    assert torch.equal(both[lengths[1]:], whole)
    slots = (tables[0].long()[:, None] * block_size + torch.arange(block_size)).flatten()
    keys, values = (exact[i].reshape(-1, kv_heads, head_size)[slots[: lengths[0]]].double()
                    for i in (0, 1))
    q = query.double().view(lengths[0], kv_heads, heads // kv_heads, head_size)
    scores = torch.einsum("tghd,pgd->tghp", q, keys) * head_size**-0.5
    position = torch.arange(lengths[0])
    visible = position[None, :] <= position[:, None]
    if window is not None:
        visible &= position[None, :] > position[:, None] - window
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    want = torch.einsum("tghp,pgd->tghd", scores.softmax(-1), values).reshape(whole.shape)
    torch.testing.assert_close(whole.double(), want, atol=1e-2, rtol=1e-2)


def _tiles_here() -> bool:
    """Whether this process's kernels run the prefill on AMX's tiles."""
    library = cpu_platform().kernel_library()
    return (
        library is not None and library.variant.name == "amx_bf16"
        and bool(library.lib.bf16_matrix_units())
    )


def _paged_prompt(gen, length, kv_heads, head_size, cache_dtype, first_block=1):
    """A cache holding one prompt's random K/V in consecutive blocks, and its table."""
    block_size = 16
    blocks = -(-length // block_size)
    rows = torch.randn(2, first_block + blocks, block_size, kv_heads, head_size, generator=gen)
    cache = kv_quant.quantize_rows(rows) if cache_dtype == torch.int8 else rows.bfloat16()
    table = torch.arange(first_block, first_block + blocks, dtype=torch.int32)[None]
    return cache, table


@needs_kernel
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.int8])
def test_the_tiles_run_where_the_cpu_has_them(cache_dtype):
    """On AMX the prefill takes the tiles (its rounding differs from the vector kernel's in
    some low bits); any variant agrees with avx512_bf16's vector kernel to bfloat16
    rounding."""
    if "avx512_bf16" not in [v.name for v in runnable_variants(detect())]:
        pytest.skip("needs the avx512_bf16 variant to compare with")
    gen = torch.Generator().manual_seed(5)
    cache, table = _paged_prompt(gen, 300, 3, 64, cache_dtype)
    query = torch.randn(300, 9, 64, generator=gen).bfloat16()
    here = _prefill(cache, table, [(0, 0, query)], 64)
    with cpu_platform().use_kernels(load_variant("avx512_bf16")):
        vector = _prefill(cache, table, [(0, 0, query)], 64)
    if _tiles_here():
        assert not torch.equal(here, vector)
    torch.testing.assert_close(here.float(), vector.float(), atol=2e-2, rtol=2e-2)


@needs_kernel
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.int8])
def test_a_non_finite_value_reaches_only_the_rows_that_see_it(cache_dtype):
    """A NaN in the cache's values at position 20 makes rows 20 on non-finite and leaves
    the rows before it finite (the tiles multiply later positions by zero probabilities:
    0 x NaN must not reach them); with a window, the tiles' rows past it are finite again.
    (The vector kernel's windowed items start at their first row's window, so there a row
    up to 15 positions past the window of the NaN is non-finite too: not asserted.)"""
    gen = torch.Generator().manual_seed(6)
    cache, table = _paged_prompt(gen, 40, 3, 64, cache_dtype)
    if cache_dtype == torch.int8:  # the row's scales
        cache[1, 2, 4, 1, 64:].view(torch.float32)[:] = float("nan")
    else:
        cache[1, 2, 4, 1, 7] = float("nan")  # block 2 = positions 16-31: position 20
    query = torch.randn(40, 9, 64, generator=gen).bfloat16()
    out = _prefill(cache, table, [(0, 0, query)], 64)
    finite = out.float().isfinite().all(dim=2)  # [position, head]
    assert finite[:20].all()
    assert not finite[20:, 3:6].any()  # the kv head holding the NaN
    assert finite[:, :3].all() and finite[:, 6:].all()
    windowed = _prefill(cache, table, [(0, 0, query)], 64, window=8)
    seen = windowed.float().isfinite().all(dim=2)[:, 3:6].all(dim=1)
    assert seen[:20].all() and not seen[20:28].any()
    if _tiles_here():
        assert seen[28:].all()


@needs_kernel
def test_a_row_does_not_depend_on_a_large_neighbour():
    """A step whose packed keys and values pass the tiles' 64 MB is taken in groups of
    requests: a small prompt's rows are the same beside a request with a long context, and
    that request's row is right."""
    gen = torch.Generator().manual_seed(8)
    kv_heads, head_size, long = 8, 512, 4200  # 16 KB packed a position: 67 MB
    cache, table = _paged_prompt(gen, long + 1, kv_heads, head_size, torch.bfloat16)
    small = torch.randn(40, kv_heads, head_size, generator=gen).bfloat16()
    tables = torch.zeros(2, table.shape[1], dtype=torch.int32)
    tables[0] = table[0]
    tables[1, :3] = table[0, :3]  # the small prompt reads the first 48 positions' blocks
    alone = _prefill(cache, tables, [(1, 0, small)], head_size)
    one = torch.randn(1, kv_heads, head_size, generator=gen).bfloat16()
    both = _prefill(cache, tables, [(1, 0, small), (0, long, one)], head_size)
    assert torch.equal(both[:40], alone)
    keys, values = (cache[i, 1:].reshape(-1, kv_heads, head_size)[: long + 1].double()
                    for i in (0, 1))
    scores = torch.einsum("hd,phd->hp", one[0].double(), keys) * head_size**-0.5
    want = torch.einsum("hp,phd->hd", scores.softmax(-1), values)
    torch.testing.assert_close(both[40].double(), want, atol=1e-2, rtol=1e-2)
