"""csrc/moe.c (the sparse MLP of small bfloat16 steps on CPU) computes what FusedMoE's torch
path does: the same experts per token and outputs equal up to bfloat16 rounding (it sums a
token's experts in float32 where torch adds bfloat16 rows one by one)."""

from __future__ import annotations

import pytest
import torch

from pagedllm import kernels
from pagedllm.kernels.variants import runnable_variants
from pagedllm.layers import cpu_ops, moe
from pagedllm.layers.moe import FusedMoE
from pagedllm.model_loader.loader import process_weights_after_loading
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect

pytestmark = pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no C compiler")
VARIANTS = [v.name for v in runnable_variants(detect()) if v.simd]


def _layer(renormalize: bool, shared: int) -> FusedMoE:
    torch.manual_seed(0)
    layer = FusedMoE(64, 32, num_experts=4, top_k=2, renormalize=renormalize,
                     shared_intermediate_size=shared)
    for param in layer.parameters():
        param.data = (torch.randn_like(param, dtype=torch.float32) * 0.3).bfloat16()
    process_weights_after_loading(layer, "int4", keep_dense=False)
    return layer


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("renormalize", "shared"), [(True, 0), (False, 64)],
                         ids=["mixtral-like", "qwen2-moe-like"])
@pytest.mark.parametrize("num_tokens", [1, 5, 40])
def test_kernel_matches_the_torch_path(renormalize, shared, num_tokens, variant, monkeypatch):
    """On every vector kernel variant this CPU runs."""
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        layer = _layer(renormalize, shared)
        x = torch.randn(num_tokens, 64, generator=torch.Generator().manual_seed(num_tokens))
        x = x.bfloat16()
        assert layer.kernel_table() is not None
        got = layer(x)
        monkeypatch.setattr(moe, "MOE_KERNEL_MAX_ROWS", 0)  # the torch path
        want = layer(x)
    torch.testing.assert_close(got.float(), want.float(), rtol=4 * 2**-7, atol=2e-2)
    assert (got == want).float().mean() > 0.6


def test_a_different_route_changes_the_output():
    """The kernel reads the router: swapping two experts' router rows moves tokens."""
    layer = _layer(True, 0)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    before = layer(x)
    table = layer.kernel_table()
    assert table is not None
    router = table.routers[0]
    router[[0, 1]] = router[[1, 0]].clone()  # the kernel's own copy, in place
    assert not torch.equal(layer(x), before)
