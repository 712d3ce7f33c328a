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
    assert torch.equal(out, theirs(x))
    assert new_residual.dtype == torch.float32 and torch.equal(new_residual, x.float())

    # The residual stream is float32 (as the previous norm returned it): the sum is not
    # rounded to the model dtype before it is normalised. In float32 runs this is exactly
    # transformers' computation.
    out, new_residual = ours(x, residual.float())
    expected_sum = x.float() + residual.float()
    assert torch.equal(new_residual, expected_sum)
    rms = torch.rsqrt(expected_sum.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(out, theirs.weight * (expected_sum * rms).to(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(out, theirs(x + residual))
    assert out.dtype == dtype


def test_statistics_in_float32() -> None:
    # bf16 squares of large values would lose the variance; float32 keeps it exact enough.
    norm = RMSNorm(4, eps=1e-6).to(torch.bfloat16)
    x = torch.tensor([[300.0, -300.0, 300.0, -300.0]], dtype=torch.bfloat16)
    out, _ = norm(x)
    torch.testing.assert_close(out.float(), torch.tensor([[1.0, -1.0, 1.0, -1.0]]))


def test_a_bfloat16_residual_is_never_overrun() -> None:
    """The fused CPU call updates a float32 residual in place; a bfloat16 residual (an EAGLE
    head once passed one) must take the torch path instead of being written past its end."""
    gen = torch.Generator().manual_seed(1)
    norm = RMSNorm(64, eps=1e-5).to(torch.bfloat16)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    residual = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    guard = torch.zeros(5, 64, dtype=torch.bfloat16)  # allocated next to it, as often
    kept = residual.clone()
    out, new_residual = norm(x, residual)
    expected, expected_residual = norm(x, residual.float())
    assert torch.equal(residual, kept) and torch.equal(guard, torch.zeros_like(guard))
    assert torch.equal(new_residual, expected_residual)
    assert torch.equal(out, expected)
