"""Bidirectional attention for encoder-only models over packed variable-length sequences, and
for items of equal length (a vision tower's images).

Encoder models (BERT, XLM-RoBERTa) see every token of their own sequence, before and after,
and keep no KV cache: a pooling request is computed once. The step's sequences arrive packed
(token after token). Inside this call they are sorted by length and cut into groups of
similar lengths, each laid out [group, longest, heads, dim] with a key mask: attention's cost
grows with the square of the padded length, so a group pads little where one batch of
every sequence would pad each to the step's longest. No padding leaves this call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedllm.attention import cpu_kernel
from pagedllm.platform import get_platform

# A group's longest sequence is at most this much longer than its shortest (plus a few
# tokens), and a group holds at most this many sequences.
_GROUP_LENGTH_RATIO = 1.3
_GROUP_LENGTH_SLACK = 4
_MAX_GROUP = 16


def packed_bidirectional_attention(
    query: torch.Tensor,  # [T, H, D]
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Each token attends to every token of its own sequence (none of the others)."""
    starts = [0]
    for length in seq_lens[:-1]:
        starts.append(starts[-1] + length)
    out = torch.empty_like(query)
    for group in length_groups(seq_lens):
        if len(group) == 1:  # one sequence: no mask, no copies
            rows = slice(starts[group[0]], starts[group[0]] + seq_lens[group[0]])
            out[rows] = _attend(query[rows], key[rows], value[rows], scale)
            continue
        lens = [seq_lens[i] for i in group]
        index = torch.cat([torch.arange(starts[i], starts[i] + seq_lens[i]) for i in group])
        out[index] = _attend_padded(query[index], key[index], value[index], lens, scale)
    return out


def length_groups(seq_lens: list[int]) -> list[list[int]]:
    """Sequence indices sorted by length, cut into groups of similar lengths."""
    order = sorted(range(len(seq_lens)), key=seq_lens.__getitem__)
    groups: list[list[int]] = []
    for index in order:
        if groups and len(groups[-1]) < _MAX_GROUP and seq_lens[index] <= (
            seq_lens[groups[-1][0]] * _GROUP_LENGTH_RATIO + _GROUP_LENGTH_SLACK
        ):
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
            ) -> torch.Tensor:  # fmt: skip
    """One sequence [L, h, D]: plain attention, every key visible."""
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
        scale=scale, enable_gqa=key.shape[1] != query.shape[1],
    )  # fmt: skip
    return out.transpose(0, 1)


def _attend_padded(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lens: list[int], scale: float
) -> torch.Tensor:
    """Packed sequences of `lens` [sum(lens), h, D], padded to the longest with a key mask."""
    longest = max(lens)
    valid = torch.arange(longest)[None, :] < torch.tensor(lens)[:, None]  # [B, L]

    def padded(x: torch.Tensor) -> torch.Tensor:  # [T, h, D] → [B, h, L, D]
        out = x.new_zeros(len(lens), longest, *x.shape[1:])
        out[valid] = x
        return out.transpose(1, 2)

    mask = None if min(lens) == longest else valid[:, None, None, :]
    out = F.scaled_dot_product_attention(
        padded(query), padded(key), padded(value), attn_mask=mask,
        scale=scale, enable_gqa=key.shape[1] != query.shape[1],
    )  # fmt: skip
    return out.transpose(1, 2)[valid]


def batched_bidirectional_attention(
    query: torch.Tensor,  # [B, N, H, D]
    key: torch.Tensor,  # [B, N, H, D]
    value: torch.Tensor,  # [B, N, H, D]
    scale: float | None = None,
) -> torch.Tensor:  # [B, N, H, D]
    """Items of N tokens each (one image's patches), every token attending to all of its own
    item's; scale None is 1 / sqrt(D). bfloat16 where the platform says the C kernel wins
    runs csrc/dense_attention.c (torch's scaled_dot_product_attention took twice its time
    on CLIP-B/16's shapes with AVX-512 BF16); anything else, torch's, so float32 outputs
    stay transformers'."""
    if get_platform(query.device).dense_attention_kernel(query.dtype):
        head_size = query.shape[-1]
        return cpu_kernel.dense_attention(
            query, key, value, head_size**-0.5 if scale is None else scale
        )
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), scale=scale
    )
    return out.transpose(1, 2)
