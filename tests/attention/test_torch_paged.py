"""The torch and C-kernel (cpu) backends against dense causal attention, request by request.

Batches mix fresh prefills, chunked prefills over a cached context, and decodes of different
lengths; block tables are random and non-contiguous; block sizes 1, 4 and 16; GQA and MHA.
"""

from __future__ import annotations

import pytest
import torch

from pagedllm.attention import cpu_kernel, torch_grouped, torch_paged
from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata
from pagedllm.attention.cpu_paged import CpuPagedBackend, CpuPagedMetadata
from pagedllm.attention.registry import backend_name_for_device, get_attention_backend
from pagedllm.attention.torch_grouped import TorchGroupedBackend
from pagedllm.attention.torch_paged import TorchPagedBackend
from pagedllm.platform.cuda import CudaPlatform

NUM_BLOCKS = 96


def make_common_metadata(
    requests: list[tuple[int, int, list[int]]], block_size: int
) -> CommonAttentionMetadata:
    """Metadata for requests given as (context_len, query_len, block_ids), as the runner does."""
    context_lens = torch.tensor([r[0] for r in requests], dtype=torch.int64)
    query_lens = torch.tensor([r[1] for r in requests], dtype=torch.int64)
    seq_lens = context_lens + query_lens
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.int64)
    query_start_loc[1:] = torch.cumsum(query_lens, 0)
    max_blocks = max(len(r[2]) for r in requests)
    block_tables = torch.zeros(len(requests), max_blocks, dtype=torch.int64)
    slots = []
    for i, (context_len, query_len, block_ids) in enumerate(requests):
        block_tables[i, : len(block_ids)] = torch.tensor(block_ids)
        for pos in range(context_len, context_len + query_len):
            slots.append(block_ids[pos // block_size] * block_size + pos % block_size)
    return CommonAttentionMetadata(
        num_reqs=len(requests),
        num_tokens=int(query_lens.sum()),
        query_start_loc=query_start_loc,
        query_lens=query_lens,
        context_lens=context_lens,
        seq_lens=seq_lens,
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_tables=block_tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_lens_cpu=query_lens.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
    )


def dense_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_len: int,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q [Lq, H, D] at positions context_len.., k/v [S, Hkv, D] at 0..S-1 → [Lq, H, D]
    (a query sees keys at positions > its own - window, when given)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [S, H, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [H, Lq, S]
    query_pos = torch.arange(q.shape[0]).unsqueeze(1) + context_len
    key_pos = torch.arange(k.shape[0])
    hidden = key_pos > query_pos
    if window is not None:
        hidden |= key_pos <= query_pos - window
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class _Case:
    """Random requests, their full K/V, and a cache holding each request's context."""

    def __init__(self, shapes, block_size, num_heads, num_kv_heads, head_size=16, seed=0):
        # The block layout depends only on the shapes, so cases of different seeds can share
        # one step's metadata like the layers of a model do.
        layout_gen = torch.Generator().manual_seed(len(shapes))
        free = (torch.randperm(NUM_BLOCKS - 1, generator=layout_gen) + 1).tolist()  # no 0
        gen = torch.Generator().manual_seed(seed)
        self.cache = torch.zeros(2, NUM_BLOCKS, block_size, num_kv_heads, head_size)
        self.requests, self.full_kv, queries = [], [], []
        for context_len, query_len in shapes:
            num_blocks = -(-(context_len + query_len) // block_size)
            block_ids = [free.pop() for _ in range(num_blocks)]
            kv = torch.randn(2, context_len + query_len, num_kv_heads, head_size, generator=gen)
            for pos in range(context_len):  # the context is already in the cache
                block, offset = block_ids[pos // block_size], pos % block_size
                self.cache[:, block, offset] = kv[:, pos]
            self.requests.append((context_len, query_len, block_ids))
            self.full_kv.append(kv)
            queries.append(torch.randn(query_len, num_heads, head_size, generator=gen))
        self.query = torch.cat(queries)
        self.key = torch.cat(
            [kv[0, c:] for kv, (c, _, _) in zip(self.full_kv, self.requests, strict=True)]
        )
        self.value = torch.cat(
            [kv[1, c:] for kv, (c, _, _) in zip(self.full_kv, self.requests, strict=True)]
        )

    def expected(self, scale: float, window: int | None = None) -> torch.Tensor:
        """Dense causal attention of every request, concatenated in batch order."""
        outs, start = [], 0
        for kv, (context_len, query_len, _) in zip(self.full_kv, self.requests, strict=True):
            q = self.query[start : start + query_len]
            outs.append(dense_causal_attention(q, kv[0], kv[1], context_len, scale, window))
            start += query_len
        return torch.cat(outs)


BATCHES = {
    "mixed": [(0, 7), (5, 1), (9, 4), (0, 1), (30, 1), (17, 12), (2, 1)],
    "decodes": [(3, 1), (40, 1), (0, 1), (17, 1), (8, 1)],
    "prefills": [(0, 9), (0, 3), (0, 20)],
    "chunked": [(12, 5), (33, 2), (4, 9)],
    "single_prefill": [(0, 23)],
    "single_chunk": [(21, 6)],
    "single_decode": [(37, 1)],
}


def make_backend(kind: bool | str) -> AttentionBackend:
    """The C-kernel backend (True), the torch reference (False or "torch") or the grouped
    torch backend ("torch_grouped")."""
    if kind == "torch_grouped":
        return TorchGroupedBackend()
    return CpuPagedBackend() if kind is True else TorchPagedBackend()


KERNELS = [
    pytest.param(False, id="torch"),
    pytest.param("torch_grouped", id="torch_grouped"),
    pytest.param(
        True,
        id="c_kernel",
        marks=pytest.mark.skipif(
            not cpu_kernel.is_available(torch.float32), reason="no C compiler to build it"
        ),
    ),
]


@pytest.mark.parametrize("use_cpu_kernel", KERNELS)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("heads", [(4, 2), (6, 2), (3, 3)])
def test_matches_dense_attention(
    block_size: int, batch: str, heads: tuple[int, int], use_cpu_kernel: bool
) -> None:
    case = _Case(BATCHES[batch], block_size, *heads)
    backend = make_backend(use_cpu_kernel)
    metadata = backend.build_metadata(make_common_metadata(case.requests, block_size), block_size)
    has_decodes = any(query_len == 1 for _, query_len in BATCHES[batch])
    assert isinstance(metadata, CpuPagedMetadata) == (use_cpu_kernel is True)
    if use_cpu_kernel is True:
        assert (metadata.decodes is not None) == has_decodes
    scale = 0.3
    before = case.cache.clone()
    out = backend.forward(case.query, case.key, case.value, case.cache, metadata, scale)
    torch.testing.assert_close(out, case.expected(scale), atol=2e-5, rtol=1e-5)
    # The cache now holds every request's full K/V, and nothing else changed.
    expected_cache = before
    for kv, (_, _, block_ids) in zip(case.full_kv, case.requests, strict=True):
        for pos in range(kv.shape[1]):
            expected_cache[:, block_ids[pos // block_size], pos % block_size] = kv[:, pos]
    assert torch.equal(case.cache, expected_cache)


@pytest.mark.parametrize("batch", ["mixed", "decodes", "prefills", "chunked", "single_prefill"])
def test_matches_dense_attention_within_memory_bounds(
    batch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiny memory bounds split the decodes into several gathers and every prefill into
    several query chunks: the result does not change."""
    monkeypatch.setattr(torch_paged, "_MAX_SCORES_PER_HEAD", 40)
    monkeypatch.setattr(torch_paged, "_MAX_GATHERED_POSITIONS", 50)
    case = _Case(BATCHES[batch], 4, 6, 2)
    backend = TorchPagedBackend()
    metadata = backend.build_metadata(make_common_metadata(case.requests, 4), 4)
    if batch in ("mixed", "decodes"):
        assert len(metadata.decodes) > 1
    if batch in ("mixed", "prefills", "chunked"):
        assert len(metadata.prefills) > 1
    out = backend.forward(case.query, case.key, case.value, case.cache, metadata, 0.3)
    torch.testing.assert_close(out, case.expected(0.3), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", ["mixed", "decodes", "prefills", "chunked", "single_prefill"])
def test_grouped_backend_with_groups_and_chunks(
    batch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grouped torch backend: tiny budgets force several length groups and several
    prefill query chunks; the result is still dense attention's."""
    monkeypatch.setattr(torch_grouped, "_SCORES_PER_HEAD", 40)
    monkeypatch.setattr(torch_grouped, "_MIN_CHUNK_ROWS", 1)
    monkeypatch.setattr(torch_grouped, "_DECODE_GROUP_COST", 0)
    monkeypatch.setattr(torch_grouped, "_PREFILL_GROUP_COST", 0)
    monkeypatch.setattr(torch_grouped, "_MAX_DECODE_GATHER_TOKENS", 50)
    case = _Case(BATCHES[batch], 4, 6, 2)
    backend = TorchGroupedBackend()
    metadata = backend.build_metadata(make_common_metadata(case.requests, 4), 4)
    groups = metadata.prefill_groups
    if groups:
        assert max(len(group.chunks) for group in groups) > 1
    if batch in ("mixed", "prefills", "chunked"):
        assert len(groups) > 1
    if batch == "mixed":  # a fresh prompt alone in its group skips the cache read
        assert any(group.kv is None for group in groups)
    if batch in ("mixed", "decodes"):
        assert len(metadata.decode_buckets) > 1
    out = backend.forward(case.query, case.key, case.value, case.cache, metadata, 0.3)
    torch.testing.assert_close(out, case.expected(0.3), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("use_cpu_kernel", KERNELS)
@pytest.mark.parametrize("window", [1, 5, 16])
@pytest.mark.parametrize("batch", ["mixed", "decodes", "chunked", "single_prefill"])
def test_sliding_window_matches_dense_attention(
    batch: str, window: int, use_cpu_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sliding-window layer sees only its last `window` keys, in every kind of step; a
    global layer of the same step (same metadata) still sees everything."""
    monkeypatch.setattr(torch_paged, "_MAX_SCORES_PER_HEAD", 40)  # several chunks a prefill
    monkeypatch.setattr(torch_grouped, "_SCORES_PER_HEAD", 40)
    monkeypatch.setattr(torch_grouped, "_MIN_CHUNK_ROWS", 1)
    case = _Case(BATCHES[batch], 4, 6, 2)
    backend = make_backend(use_cpu_kernel)
    metadata = backend.build_metadata(make_common_metadata(case.requests, 4), 4)
    windowed = backend.forward(
        case.query, case.key, case.value, case.cache, metadata, 0.3, window
    )
    torch.testing.assert_close(windowed, case.expected(0.3, window), atol=2e-5, rtol=1e-5)
    full = backend.forward(case.query, case.key, case.value, case.cache, metadata, 0.3)
    torch.testing.assert_close(full, case.expected(0.3), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["torch", "torch_grouped"])
def test_metadata_is_shared_by_layers(kind: str) -> None:
    """Two layers (caches) of one step reuse the metadata (and its derived tensors)."""
    shapes = BATCHES["mixed"]
    case0, case1 = _Case(shapes, 4, 4, 2, seed=1), _Case(shapes, 4, 4, 2, seed=2)
    backend = make_backend(kind)
    metadata = backend.build_metadata(make_common_metadata(case0.requests, 4), 4)
    for case in (case0, case1):
        out = backend.forward(case.query, case.key, case.value, case.cache, metadata, 0.25)
        torch.testing.assert_close(out, case.expected(0.25), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("use_cpu_kernel", KERNELS)
def test_bfloat16_close_to_float32(use_cpu_kernel: bool) -> None:
    case = _Case(BATCHES["mixed"], 16, 6, 2, head_size=64)
    backend = make_backend(use_cpu_kernel)
    metadata = backend.build_metadata(make_common_metadata(case.requests, 16), 16)
    out = backend.forward(
        case.query.bfloat16(),
        case.key.bfloat16(),
        case.value.bfloat16(),
        case.cache.bfloat16(),
        metadata,
        0.125,
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), case.expected(0.125), atol=3e-2, rtol=3e-2)


def test_registry_picks_the_kernels_on_cpu_where_they_serve(monkeypatch) -> None:
    kernels_here = cpu_kernel.is_available(torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        backend = get_attention_backend("cpu", dtype)
        assert isinstance(backend, CpuPagedBackend if kernels_here else TorchGroupedBackend)
        assert backend.get_kv_cache_shape(10, 16, 3, 64) == (2, 10, 16, 3, 64)
    # Where neither the C kernels nor Triton serve, torch's grouped backend (the reference
    # is only ever named outright).
    assert backend_name_for_device("cpu", torch.float16) == "torch_grouped"
    # CUDA takes the Triton kernel (tests/attention/test_triton_paged.py), torch without it.
    monkeypatch.setattr(CudaPlatform, "runs_triton", lambda self: False)
    assert backend_name_for_device("cuda:0", torch.float32) == "torch_grouped"
    monkeypatch.setenv("PAGEDLLM_ATTENTION_KERNEL", "torch")
    assert backend_name_for_device("cpu", torch.bfloat16) == "torch_grouped"
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "torch")
    assert backend_name_for_device("cpu", torch.bfloat16) == "torch"
