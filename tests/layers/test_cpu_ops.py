"""The fused bfloat16 CPU ops reproduce the torch op chains they replace.

Each is compared with the same layer's torch path (the fused ops switched off) on random
data: equal to within two bfloat16 roundings everywhere (a value one step apart after the
first of two rounded ops may end two steps apart), and bit-equal almost everywhere (they
differ only where a float32 sum or libm rounds differently).
"""

from __future__ import annotations

import pytest
import torch

from pagedllm.layers import cpu_ops
from pagedllm.layers.activation import Activation, ActivationAndMul, SiluAndMul
from pagedllm.layers.layernorm import LayerNorm, RMSNorm
from pagedllm.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(
    not cpu_ops.fused_ops_available(), reason="no C compiler to build the fused ops"
)
BF16_STEP = 2**-7  # relative spacing of bfloat16 values


@pytest.fixture
def torch_ops(monkeypatch: pytest.MonkeyPatch):
    """Run the torch op chains instead of the fused ops inside the block."""

    class Switch:
        def __enter__(self) -> None:
            monkeypatch.setattr(cpu_ops, "serves", lambda x: False)

        def __exit__(self, *exc: object) -> None:
            monkeypatch.undo()

    return Switch()


def _assert_same_up_to_rounding(fused: torch.Tensor, reference: torch.Tensor) -> None:
    assert fused.dtype == reference.dtype and fused.shape == reference.shape
    fused, reference = fused.float(), reference.float()
    torch.testing.assert_close(fused, reference, rtol=2 * BF16_STEP, atol=1e-6)
    assert (fused == reference).float().mean() > 0.99


@pytest.mark.parametrize("num_tokens", [1, 7, 64])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(num_tokens, with_residual, torch_ops):
    gen = torch.Generator().manual_seed(num_tokens)
    norm = RMSNorm(576, eps=1e-5)
    norm.weight.data = (torch.rand(576, generator=gen) + 0.5).bfloat16()
    x = torch.randn(num_tokens, 576, generator=gen).bfloat16()
    residual = torch.randn(num_tokens, 576, generator=gen) * 4 if with_residual else None
    assert cpu_ops.serves(x)
    out, new_residual = norm(x, None if residual is None else residual.clone())
    with torch_ops:
        want, want_residual = norm(x, residual)
    _assert_same_up_to_rounding(out, want)
    torch.testing.assert_close(new_residual, want_residual, atol=0, rtol=0)


def test_add_rms_norm_reads_strided_rows():
    wide = torch.randn(5, 1000).bfloat16()
    x = wide[:, 100:676]  # rows 1000 apart
    norm = RMSNorm(576)
    norm.weight.data = torch.ones(576).bfloat16()
    out, _ = norm(x)
    _assert_same_up_to_rounding(out, norm(x.contiguous().float())[0].bfloat16())


@pytest.mark.parametrize("num_tokens", [1, 40])
def test_silu_and_mul(num_tokens, torch_ops):
    x = (torch.randn(num_tokens, 2 * 1536, generator=torch.Generator().manual_seed(3)) * 3)
    x = x.bfloat16()
    out = SiluAndMul()(x)
    with torch_ops:
        want = SiluAndMul()(x)
    _assert_same_up_to_rounding(out, want)


@pytest.mark.parametrize("num_tokens", [1, 7, 64])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_layer_norm(num_tokens, with_residual, torch_ops):
    """GPT-2 / OPT's LayerNorm with its bias and the residual add, as one C call."""
    gen = torch.Generator().manual_seed(num_tokens + 100)
    norm = LayerNorm(576, eps=1e-5)
    norm.weight.data = (torch.rand(576, generator=gen) + 0.5).bfloat16()
    assert norm.bias is not None
    norm.bias.data = torch.randn(576, generator=gen).bfloat16()
    x = (torch.randn(num_tokens, 576, generator=gen) + 0.3).bfloat16()
    residual = torch.randn(num_tokens, 576, generator=gen) * 4 if with_residual else None
    out, new_residual = norm(x, None if residual is None else residual.clone())
    with torch_ops:
        want, want_residual = norm(x, residual)
    _assert_same_up_to_rounding(out, want)
    torch.testing.assert_close(new_residual, want_residual, atol=0, rtol=0)


def test_plain_mlp_activations(torch_ops):
    """GPT-2's gelu_new and OPT's ReLU between fc1 and fc2, as one C call each."""
    x = (torch.randn(9, 384, generator=torch.Generator().manual_seed(8)) * 3).bfloat16()
    assert torch.equal(cpu_ops.activation("relu", x), torch.relu(x))
    out = cpu_ops.activation("gelu_tanh", x)
    want = torch.nn.functional.gelu(x, approximate="tanh")
    torch.testing.assert_close(out.float(), want.float(), rtol=2 * BF16_STEP, atol=1e-5)


def test_quick_gelu_matches_torch_chain(torch_ops):
    """CLIP's quick GELU (vision towers) as one C pass: torch's three bfloat16 ops rounded
    the same way, so equal to within one libm ulp of the sigmoid; a [B, N, d] tower
    activation goes through the fused pass too."""
    x = (torch.randn(2, 197, 768, generator=torch.Generator().manual_seed(9)) * 3).bfloat16()
    act = Activation("quick_gelu")
    out = act(x)
    with torch_ops:
        want = act(x)
    assert out.shape == want.shape
    _assert_same_up_to_rounding(out, want)
    assert (out == want).float().mean() > 0.99


@pytest.mark.parametrize("num_tokens", [1, 40])
def test_gelu_tanh_and_mul(num_tokens, torch_ops):
    """Gemma's GeGLU (gelu_pytorch_tanh) as one C call: within two bfloat16 roundings of
    torch's. Bit-equal on fewer values than the other ops (~98%): for negative inputs
    0.5 g (1 + tanh(..)) cancels, so the last bits of float32 tanh (libm's here, SLEEF's in
    torch) show; against the float64 formula it is exact as often as torch is."""
    x = (torch.randn(num_tokens, 2 * 1024, generator=torch.Generator().manual_seed(5)) * 3)
    x = x.bfloat16()
    geglu = ActivationAndMul("gelu_tanh")
    out = geglu(x)
    with torch_ops:
        want = geglu(x)
    # atol: the far negative tail (|value| < 1e-5) is all cancellation in both.
    torch.testing.assert_close(out.float(), want.float(), rtol=2 * BF16_STEP, atol=1e-5)
    gate, up = x.double().chunk(2, dim=-1)
    inner = 0.7978845608028654 * (gate + 0.044715 * gate**3)
    exact = (0.5 * gate * (1 + torch.tanh(inner))).bfloat16().double() * up
    exact = exact.bfloat16()
    ours, torchs = (out == exact).float().mean(), (want == exact).float().mean()
    assert ours >= torchs - 0.01


@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("num_tokens", [1, 48])
def test_rope_in_place_matches_torch(rotary_dim, num_tokens, torch_ops):
    gen = torch.Generator().manual_seed(rotary_dim + num_tokens)
    rope = RotaryEmbedding(64, max_position=4096, base=10000.0, rotary_dim=rotary_dim)
    heads, kv_heads = 9, 3
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * 64, generator=gen).bfloat16()
    positions = torch.randint(0, 4096, (num_tokens,), generator=gen)
    untouched_v = qkv[:, (heads + kv_heads) * 64 :].clone()
    with torch_ops:
        want_q, want_k = rope.forward_adjacent(positions, qkv[:, : (heads + kv_heads) * 64], heads)
    q, k = rope.forward_adjacent(positions, qkv[:, : (heads + kv_heads) * 64], heads)
    assert q.shape == (num_tokens, heads, 64) and k.shape == (num_tokens, kv_heads, 64)
    _assert_same_up_to_rounding(q, want_q)
    _assert_same_up_to_rounding(k, want_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * 64 :], untouched_v)


def test_float32_keeps_the_torch_path():
    assert not cpu_ops.serves(torch.randn(3, 8))
    assert not cpu_ops.serves(torch.randn(3, 4, 8).bfloat16())
