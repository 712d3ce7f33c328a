"""Attention layers: the models' only way to attention.

`Attention` reshapes q/k/v and hands them to the active backend with its KV cache; it owns
no cache and no metadata: both come from the forward context set by the model runner for
the step, so the same module works with any backend. `EncoderAttention` is an encoder's
bidirectional attention over packed sequences, with no KV cache at all.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.attention.encoder import (
    batched_bidirectional_attention,
    packed_bidirectional_attention,
)
from pagedllm.layers.forward_context import get_forward_context


class Attention(nn.Module):
    """Paged multi-head attention (GQA when num_kv_heads < num_heads) for one layer."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        layer_idx: int = 0,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})."
            )
        self.layer_idx = layer_idx
        # Each query sees only the keys at positions > its own - sliding_window (None: all).
        self.sliding_window = sliding_window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H*D], k and v [T, Hkv*D] (or already [T, heads, D]) → [T, H*D].

        Also stores k/v in this layer's cache.
        """
        ctx = get_forward_context()
        num_tokens = q.shape[0]
        out = ctx.backend.forward(
            q.view(num_tokens, self.num_heads, self.head_size),
            k.view(num_tokens, self.num_kv_heads, self.head_size),
            v.view(num_tokens, self.num_kv_heads, self.head_size),
            ctx.kv_caches[self.layer_idx],
            ctx.metadata_for(self.layer_idx),
            self.scale,
            self.sliding_window,
        )  # [T, H, D]
        return out.reshape(num_tokens, self.num_heads * self.head_size)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, "
            f"head_size={self.head_size}, layer_idx={self.layer_idx}, "
            f"sliding_window={self.sliding_window}"
        )


class EncoderAttention(nn.Module):
    """Bidirectional attention of packed sequences: each token sees every token of its own
    sequence and none of the others'; nothing is cached (attention/encoder.py)."""

    def __init__(self, num_heads: int, head_size: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int]
    ) -> torch.Tensor:
        """q, k, v [T, H, D] of sequences packed back to back → [T, H * D]."""
        out = packed_bidirectional_attention(q, k, v, seq_lens, self.scale)
        return out.reshape(q.shape[0], self.num_heads * self.head_size)


def image_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k, v [B, N, H, D]: each of B items (an image's patches) attends to its own N tokens,
    bidirectionally, scaled by 1 / sqrt(D), nothing cached → [B, N, H, D]."""
    return batched_bidirectional_attention(q, k, v)
