"""The C decode kernel: switched off on request, and exact on long GQA contexts."""

from __future__ import annotations

import pytest
import torch

from pagedllm.attention import cpu_kernel
from pagedllm.attention.torch_paged import TorchPagedBackend

from .test_torch_paged import make_common_metadata

needs_kernel = pytest.mark.skipif(
    not cpu_kernel.is_available(torch.float32), reason="no C compiler to build the kernel"
)


def test_environment_switches_the_kernel_off(monkeypatch):
    monkeypatch.setenv("PAGEDLLM_ATTENTION_KERNEL", "torch")
    cpu_kernel._library.cache_clear()
    try:
        assert not cpu_kernel.is_available(torch.float32)
        assert not TorchPagedBackend()._kernel_serves(torch.device("cpu"))
    finally:
        monkeypatch.delenv("PAGEDLLM_ATTENTION_KERNEL")
        cpu_kernel._library.cache_clear()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_gqa_decodes_match_torch_path(dtype):
    """Nine query heads on three kv heads (SmolLM2's shape), contexts of several blocks."""
    gen = torch.Generator().manual_seed(0)
    block_size, num_blocks, heads, kv_heads, head_size = 16, 80, 9, 3, 64
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
        backend = TorchPagedBackend(use_kernel)
        metadata = backend.build_metadata(common, block_size)
        assert (metadata.kernel_decodes is not None) == use_kernel
        outs.append(backend.forward(query, key, value, cache.clone(), metadata, 0.125))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=tolerance, rtol=tolerance)
