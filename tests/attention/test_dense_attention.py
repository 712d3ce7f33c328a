"""The C dense attention (csrc/dense_attention.c): a vision tower's bidirectional attention
over [B, N, H, D] bfloat16 tensors, against a float64 reference and torch's own path."""

from __future__ import annotations

import pytest
import torch

from pagedllm.attention import cpu_kernel
from pagedllm.models.vision_towers import VisionAttention
from pagedllm.platform import get_platform
from pagedllm.platform.cpu_features import detect

needs_kernel = pytest.mark.skipif(
    not cpu_kernel.is_available(torch.bfloat16), reason="no C compiler to build the kernel"
)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale q k^T) v per item and head, in float64 ([B, N, H, D] in and out)."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    weights = (q @ k.transpose(-1, -2) * scale).softmax(-1)
    return (weights @ v).transpose(1, 2)


@needs_kernel
# CLIP-B/16's 197 tokens and 12 heads of 64; one token; whole and partial key tiles of 16;
# head sizes with tails shorter than a vector (36, 80) and a long one (128)
@pytest.mark.parametrize(
    "shape", [(3, 197, 12, 64), (1, 1, 2, 64), (2, 16, 3, 64), (2, 17, 3, 80), (2, 40, 2, 128),
              (1, 33, 4, 36)],
)
def test_matches_a_float64_reference(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    q, k, v = (torch.randn(*shape, generator=gen).bfloat16() for _ in range(3))
    scale = shape[-1] ** -0.5
    out = cpu_kernel.dense_attention(q, k, v, scale)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    want = _reference(q, k, v, scale)
    # each output value is rounded to bfloat16 once: half a unit in its 8th bit
    torch.testing.assert_close(out.double(), want, atol=1e-3, rtol=2**-8)


@needs_kernel
def test_an_images_result_does_not_depend_on_the_others():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(5, 50, 4, 64, generator=gen).bfloat16() for _ in range(3))
    together = cpu_kernel.dense_attention(q, k, v, 0.125)
    alone = cpu_kernel.dense_attention(q[2:3], k[2:3], v[2:3], 0.125)
    assert torch.equal(alone[0], together[2])


@needs_kernel
def test_refuses_other_dtypes_and_shapes():
    x = torch.zeros(1, 4, 2, 64)
    with pytest.raises(ValueError, match="bfloat16"):
        cpu_kernel.dense_attention(x, x, x, 0.125)
    with pytest.raises(ValueError, match="bfloat16"):  # every one of the three is checked
        cpu_kernel.dense_attention(x.bfloat16(), x, x.bfloat16(), 0.125)
    y = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one shape"):
        cpu_kernel.dense_attention(y, y[:, :3], y[:, :3], 0.125)


@needs_kernel
def test_the_platform_picks_it_only_where_it_wins():
    """Only the avx512_bf16 variant without AMX takes it (measured 2.1x torch's there; even
    with AVX2, far slower on the scalar reference); never float32."""
    platform = get_platform("cpu")
    library = platform.kernel_library()
    assert library is not None
    wins = library.variant.name == "avx512_bf16" and "amx_bf16" not in detect().flags
    assert platform.dense_attention_kernel(torch.bfloat16) == wins
    assert not platform.dense_attention_kernel(torch.float32)


@needs_kernel
def test_the_bfloat16_vision_attention_runs_on_it_where_it_wins(monkeypatch):
    """A bfloat16 tower's attention takes the C kernel where the platform says it wins
    (PAGEDLLM_ATTENTION_KERNEL=torch keeps torch's scaled_dot_product_attention); both agree
    to bfloat16 rounding; a float32 tower always keeps torch's path (whose outputs the
    multimodal tests check against transformers')."""
    torch.manual_seed(0)
    attention = VisionAttention(hidden_size=96, num_heads=3).bfloat16()
    x = torch.randn(2, 30, 96).bfloat16()
    calls = []
    original = cpu_kernel.dense_attention
    monkeypatch.setattr(cpu_kernel, "dense_attention", lambda *a: calls.append(1) or original(*a))
    expected = 1 if get_platform("cpu").dense_attention_kernel(torch.bfloat16) else 0
    with torch.no_grad():
        kernel_out = attention(x)
        assert len(calls) == expected
        monkeypatch.setenv("PAGEDLLM_ATTENTION_KERNEL", "torch")
        torch_out = attention(x)
        monkeypatch.delenv("PAGEDLLM_ATTENTION_KERNEL")
        assert len(calls) == expected  # switched off: torch's path
        attention.float()(x.float())
    assert len(calls) == expected  # float32: torch's path
    torch.testing.assert_close(kernel_out.float(), torch_out.float(), atol=2e-2, rtol=2e-2)
