"""RotaryEmbedding against transformers' Llama rotary embedding (default, linear, llama3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pagedllm.layers.rotary import RotaryEmbedding, rope_config_of

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
SCALINGS = {"default": None, "linear": {"rope_type": "linear", "factor": 4.0}, "llama3": LLAMA3}


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_transformers(scaling: str, dtype: torch.dtype) -> None:
    num_heads, num_kv_heads, head_dim, num_tokens = 4, 2, 32, 50
    config = LlamaConfig(
        hidden_size=num_heads * head_dim,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        rope_theta=5000.0,
        rope_scaling=SCALINGS[scaling],
    )
    theta, rope_scaling = rope_config_of(config)
    rope = RotaryEmbedding(head_dim, 512, theta, rope_scaling).to(dtype)
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 512, (num_tokens,), generator=gen)
    q = torch.randn(num_tokens, num_heads * head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads * head_dim, generator=gen).to(dtype)
    q_out, k_out = rope(positions, q, k)

    hf_rope = LlamaRotaryEmbedding(config)
    cos, sin = hf_rope(q, positions.unsqueeze(0))  # [1, T, D]
    hf_q, hf_k = apply_rotary_pos_emb(
        q.view(1, num_tokens, num_heads, head_dim).transpose(1, 2),
        k.view(1, num_tokens, num_kv_heads, head_dim).transpose(1, 2),
        cos,
        sin,
    )  # [1, heads, T, D]
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(q_out, hf_q.transpose(1, 2).reshape(num_tokens, -1), **tol)
    torch.testing.assert_close(k_out, hf_k.transpose(1, 2).reshape(num_tokens, -1), **tol)


def test_inputs_are_not_modified_and_views_are_accepted() -> None:
    rope = RotaryEmbedding(8, 16)
    qkv = torch.randn(5, 4 * 8)
    q, k = qkv[:, :16], qkv[:, 16:]  # non-contiguous views, as split from a fused QKV
    before = qkv.clone()
    q_out, k_out = rope(torch.arange(5), q, k)
    assert torch.equal(qkv, before)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    # Position 0 is the identity rotation.
    torch.testing.assert_close(q_out[0], q[0])


def test_both_config_spellings() -> None:
    old = SimpleNamespace(rope_theta=500000.0, rope_scaling=dict(LLAMA3))
    new = SimpleNamespace(rope_parameters={**LLAMA3, "rope_theta": 500000.0})
    plain = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert rope_config_of(old) == (500000.0, LLAMA3)
    theta, scaling = rope_config_of(new)
    assert theta == 500000.0 and scaling is not None and scaling["factor"] == 8.0
    assert rope_config_of(plain) == (1e6, None)
    assert rope_config_of(SimpleNamespace(rope_theta=10000.0, rope_scaling=None)) == (10000.0, None)


def test_unsupported_scaling_is_rejected() -> None:
    with pytest.raises(ValueError, match="yarn"):
        RotaryEmbedding(8, 16, scaling={"rope_type": "yarn", "factor": 2.0})
