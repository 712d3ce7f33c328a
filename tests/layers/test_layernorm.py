"""RMSNorm against transformers' LlamaRMSNorm, with and without the fused residual add."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pagedllm.layers.layernorm import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_transformers(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, generator=gen)
    ours, theirs = RMSNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = (torch.randn(7, 64, generator=gen) * 3).to(dtype)
    residual = torch.randn(7, 64, generator=gen).to(dtype)

    out, new_residual = ours(x)
    assert torch.equal(out, theirs(x)) and new_residual is x

    out, new_residual = ours(x, residual)
    assert torch.equal(new_residual, x + residual)
    assert torch.equal(out, theirs(x + residual))
    assert out.dtype == dtype


def test_statistics_in_float32() -> None:
    # bf16 squares of large values would lose the variance; float32 keeps it exact enough.
    norm = RMSNorm(4, eps=1e-6).to(torch.bfloat16)
    x = torch.tensor([[300.0, -300.0, 300.0, -300.0]], dtype=torch.bfloat16)
    out, _ = norm(x)
    torch.testing.assert_close(out.float(), torch.tensor([[1.0, -1.0, 1.0, -1.0]]))
