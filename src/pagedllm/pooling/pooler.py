"""Pooling packed hidden states: one output per sequence, no padding.

The batch is the model runner's: the tokens of every sequence one after the other,
`seq_lens` long each. MEAN averages a sequence's tokens, CLS takes its first, LAST its last,
ALL keeps them all, STEP keeps those whose input token is the step tag. Embeddings are then
cut to `dimensions` (Matryoshka) and L2-normalized if asked; class logits go through a
softmax if asked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedllm.pooling.config import PoolerConfig


def first_token_rows(seq_lens: list[int]) -> torch.Tensor:
    """Rows of each packed sequence's first token (its CLS / <s>), [num_seqs] int64."""
    return torch.tensor([0, *seq_lens[:-1]]).cumsum(0)


def last_token_rows(seq_lens: list[int]) -> torch.Tensor:
    """Rows of each packed sequence's last token, [num_seqs] int64."""
    return torch.tensor(seq_lens).cumsum(0) - 1


def pool_hidden_states(
    hidden_states: torch.Tensor,  # [T, H]
    seq_lens: list[int],
    pooling_type: str,
    input_ids: torch.Tensor | None = None,  # [T], for STEP pooling
    step_tag_id: int | None = None,
) -> list[torch.Tensor]:
    """One tensor per sequence: [H] for MEAN/CLS/LAST, [n, H] for ALL and STEP."""
    if pooling_type == "CLS":
        return list(hidden_states[first_token_rows(seq_lens)].unbind(0))
    if pooling_type == "LAST":
        return list(hidden_states[last_token_rows(seq_lens)].unbind(0))
    lens = torch.tensor(seq_lens)
    if pooling_type == "MEAN":
        # One segment sum over the packed tokens: no padding, no loop per sequence.
        segment = torch.repeat_interleave(torch.arange(len(seq_lens)), lens)
        sums = torch.zeros(len(seq_lens), hidden_states.shape[1], dtype=torch.float32)
        sums.index_add_(0, segment, hidden_states.float())
        return list((sums / lens[:, None]).to(hidden_states.dtype).unbind(0))
    parts = list(hidden_states.split(seq_lens))
    if pooling_type == "ALL":
        return parts
    if pooling_type == "STEP":
        if input_ids is None or step_tag_id is None:
            raise ValueError("STEP pooling needs the input ids and a step_tag_id.")
        tags = input_ids.split(seq_lens)
        return [part[ids == step_tag_id] for part, ids in zip(parts, tags, strict=True)]
    raise ValueError(f"Unknown pooling_type {pooling_type!r}.")


def finish_embedding(embedding: torch.Tensor, config: PoolerConfig) -> torch.Tensor:
    """Matryoshka truncation, then L2 normalization, as the config asks (float32)."""
    embedding = embedding.float()
    if config.dimensions is not None:
        if config.dimensions > embedding.shape[-1]:
            raise ValueError(
                f"dimensions={config.dimensions} is more than the model's "
                f"{embedding.shape[-1]}."
            )
        embedding = embedding[..., : config.dimensions]
    if config.normalize:
        embedding = F.normalize(embedding, p=2, dim=-1)
    return embedding


def finish_scores(logits: torch.Tensor, config: PoolerConfig) -> torch.Tensor:
    """Class logits [..., L] → probabilities when the config asks (`softmax`), float32: a
    softmax over the labels, or a sigmoid when there is one label (a cross-encoder's or a
    binary classifier's score)."""
    logits = logits.float()
    if not config.softmax:
        return logits
    return logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(dim=-1)
