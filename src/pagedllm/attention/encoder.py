"""Bidirectional attention for encoder-only models over packed variable-length sequences.

Encoder models (BERT, XLM-RoBERTa) see every token of their own sequence, before and after,
and keep no KV cache: a pooling request is computed once. The step's sequences arrive packed
(token after token); they are laid out [batch, longest, heads, dim] only inside this call,
with a key mask, so no padding flows through the rest of the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def packed_bidirectional_attention(
    query: torch.Tensor,  # [T, H, D]
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Each token attends to every token of its own sequence (none of the others)."""
    if len(seq_lens) == 1:  # one sequence: no mask at all
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
            scale=scale, enable_gqa=key.shape[1] != query.shape[1],
        )  # fmt: skip
        return out.transpose(0, 1)
    longest = max(seq_lens)
    lens = torch.tensor(seq_lens)
    valid = torch.arange(longest)[None, :] < lens[:, None]  # [B, L]

    def padded(x: torch.Tensor) -> torch.Tensor:  # [T, h, D] → [B, h, L, D]
        out = x.new_zeros(len(seq_lens), longest, *x.shape[1:])
        out[valid] = x
        return out.transpose(1, 2)

    out = F.scaled_dot_product_attention(
        padded(query), padded(key), padded(value), attn_mask=valid[:, None, None, :],
        scale=scale, enable_gqa=key.shape[1] != query.shape[1],
    )  # fmt: skip
    return out.transpose(1, 2)[valid]  # [T, H, D]
