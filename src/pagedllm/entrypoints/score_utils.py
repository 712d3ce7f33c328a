"""Scoring text pairs, shared by `LLM.score` and the server's /score and /rerank.

A cross-encoder (a model serving the "score" task) reads each pair as one input, tokenized
as its tokenizer joins a text pair (token types 1 on the second text for BERT). An embedding
model scores a pair by the cosine of the two texts' embeddings, as vLLM does.
"""

from __future__ import annotations

from typing import Any

import torch


def pair_up(data_1: str | list[str], data_2: str | list[str]) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs to score: one text against many, or pairwise.

    Raises:
        ValueError: for empty inputs or lists of different lengths (other than 1 to N).
    """
    first = [data_1] if isinstance(data_1, str) else list(data_1)
    second = [data_2] if isinstance(data_2, str) else list(data_2)
    if not first or not second:
        raise ValueError("Both sides of a score request need at least one text.")
    if not all(isinstance(t, str) for t in first + second):
        raise ValueError("Score inputs must be strings.")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValueError(
            f"Score inputs must be one text against many, or lists of the same length; got "
            f"{len(first)} and {len(second)}."
        )
    return list(zip(first, second, strict=True))


def cross_encoder_prompt(
    tokenizer: Any, text_1: str, text_2: str, truncate_prompt_tokens: int | None, max_len: int
) -> dict[str, Any]:
    """One pair as a cross-encoder input: `{"prompt_token_ids", "token_type_ids"}`."""
    kwargs: dict[str, Any] = {}
    if truncate_prompt_tokens is not None:
        kwargs = {"truncation": True, "max_length": min(
            max_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens, max_len
        )}  # fmt: skip
    encoded = tokenizer(text=text_1, text_pair=text_2, **kwargs)
    prompt: dict[str, Any] = {"prompt_token_ids": list(encoded["input_ids"])}
    if "token_type_ids" in encoded:
        prompt["token_type_ids"] = list(encoded["token_type_ids"])
    return prompt


def cosine_score(embedding_1: torch.Tensor, embedding_2: torch.Tensor) -> torch.Tensor:
    """The cosine similarity of two embeddings, as a one-value tensor."""
    return torch.nn.functional.cosine_similarity(
        embedding_1.float(), embedding_2.float(), dim=0
    ).reshape(1)
