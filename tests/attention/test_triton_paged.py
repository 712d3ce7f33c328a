"""The Triton attention backend, run by Triton's interpreter on CPU (TRITON_INTERPRET=1):
the kernel's logic against dense attention (every batch shape of the torch backend's tests,
GQA, sliding windows, long and odd head sizes), the cache writes, and the registry's
choice. The same tests run compiled on a GPU (tests/cuda/)."""

from __future__ import annotations

import pytest
import torch

from pagedllm.attention import kv_quant
from pagedllm.attention.registry import backend_name_for_device, create_attention_backend
from pagedllm.attention.triton_paged import TritonPagedBackend, TritonPagedMetadata

from .test_kv_quant import _int8_case
from .test_torch_paged import BATCHES, _Case, make_common_metadata

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _run(case: _Case, block_size: int, scale: float, window: int | None = None):
    backend = TritonPagedBackend()
    metadata = backend.build_metadata(make_common_metadata(case.requests, block_size), block_size)
    assert isinstance(metadata, TritonPagedMetadata)
    return backend.forward(
        case.query, case.key, case.value, case.cache, metadata, scale, window
    )


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("heads", [(6, 2), (3, 3)])  # GQA of 3 (not a power of 2); MHA
def test_matches_dense_attention(block_size: int, batch: str, heads: tuple[int, int]) -> None:
    case = _Case(BATCHES[batch], block_size, *heads)
    before = case.cache.clone()
    out = _run(case, block_size, 0.3)
    torch.testing.assert_close(out, case.expected(0.3), atol=2e-5, rtol=1e-5)
    # The cache now holds every request's full K/V, and nothing else changed.
    for kv, (_, _, block_ids) in zip(case.full_kv, case.requests, strict=True):
        for pos in range(kv.shape[1]):
            before[:, block_ids[pos // block_size], pos % block_size] = kv[:, pos]
    assert torch.equal(case.cache, before)


@pytest.mark.parametrize("window", [1, 5, 40])
@pytest.mark.parametrize("batch", ["mixed", "decodes", "chunked", "single_prefill"])
def test_sliding_window_matches_dense_attention(batch: str, window: int) -> None:
    case = _Case(BATCHES[batch], 4, 6, 2)
    out = _run(case, 4, 0.3, window)
    torch.testing.assert_close(out, case.expected(0.3, window), atol=2e-5, rtol=1e-5)


def test_long_contexts_many_query_tiles_and_odd_head_size() -> None:
    """Prompts longer than one query tile (64 rows / 3 heads per kv head = 21 tokens), keys
    over many tiles, and head_size 40 (padded to 64 in the kernel)."""
    shapes = [(0, 70), (90, 30), (150, 1), (0, 1)]
    case = _Case(shapes, 16, 9, 3, head_size=40)
    out = _run(case, 16, 0.125)
    torch.testing.assert_close(out, case.expected(0.125), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_float32_attention(dtype: torch.dtype) -> None:
    case = _Case(BATCHES["mixed"], 4, 6, 2, head_size=64)
    expected = case.expected(0.125)
    case.cache, case.query = case.cache.to(dtype), case.query.to(dtype)
    case.key, case.value = case.key.to(dtype), case.value.to(dtype)
    out = _run(case, 4, 0.125)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("batch", ["mixed", "decodes", "chunked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_cache_matches_dense_attention_over_the_round_trip(
    batch: str, dtype: torch.dtype
) -> None:
    """kv_cache_dtype="int8": the kernel reads codes and scales; the new tokens are written
    as int8 rows (the same bytes as the torch writer's) and attended as read back."""
    case = _int8_case(batch, 16, (6, 2), head_size=64)
    assert TritonPagedBackend.get_kv_cache_shape(8, 16, 2, 64, "int8") == (2, 8, 16, 2, 80)
    before, expected = case.cache.clone(), case.expected(0.125)
    case.query, case.key, case.value = (t.to(dtype) for t in (case.query, case.key, case.value))
    out = _run(case, 16, 0.125)
    tolerance = 2e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    torch_cache = before.clone()
    kv_quant.store_rows(torch_cache, case.key, case.value,
                        make_common_metadata(case.requests, 16).slot_mapping)
    assert torch.equal(case.cache, torch_cache)


def test_cpu_without_the_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    case = _Case(BATCHES["decodes"], 4, 4, 2)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        _run(case, 4, 0.3)


def test_registry_picks_triton_on_cuda_and_obeys_the_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert backend_name_for_device("cuda") == "triton"
    assert backend_name_for_device("cuda:1", torch.bfloat16) == "triton"
    assert backend_name_for_device("cpu") != "triton"
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    assert backend_name_for_device("cpu") == "triton"
    assert isinstance(create_attention_backend("triton"), TritonPagedBackend)
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "flash")
    with pytest.raises(ValueError, match="PAGEDLLM_ATTENTION_BACKEND"):
        backend_name_for_device("cuda")


@pytest.mark.parametrize("num_splits", [1, 3, 16])
@pytest.mark.parametrize("window", [None, 5])
def test_split_decoding_matches_dense_attention(num_splits: int, window: int | None) -> None:
    """Decodes with each request's keys shared by several programs (flash-decoding), some
    shares empty (short contexts, windows), then combined."""
    from pagedllm.triton_kernels.paged_attention import paged_attention

    case = _Case(BATCHES["decodes"], 4, 6, 2)
    backend = TritonPagedBackend()
    metadata = backend.build_metadata(make_common_metadata(case.requests, 4), 4)
    backend.forward(case.query, case.key, case.value, case.cache, metadata, 0.3, window)
    out = paged_attention(case.query, case.cache, metadata.block_tables, metadata.seq_lens,
                          metadata.query_start_loc, 1, 0.3, window, num_splits=num_splits)
    torch.testing.assert_close(out, case.expected(0.3, window), atol=2e-5, rtol=1e-5)


def test_decode_splits_follow_the_batch_shape() -> None:
    from pagedllm.triton_kernels.paged_attention import decode_splits

    assert decode_splits(1, 3) == 16  # one request on SmolLM2's 3 kv heads
    assert decode_splits(8, 3) == 5
    assert decode_splits(64, 3) == 1  # enough programs without splitting
    assert decode_splits(1, 3, max_seq_len=70) == 3  # no more shares than key tiles
    assert decode_splits(1, 3, max_seq_len=5000) == 16
