"""Synthetic prompts for the benchmarks: seeded, of exact token lengths (vLLM's "random"
dataset), or as text of about that many tokens for a server whose tokenizer is unknown."""

from __future__ import annotations

import random

WORDS = (
    "the", "engine", "keeps", "every", "request's", "cache", "in", "fixed", "blocks", "so",
    "that", "thousands", "of", "sequences", "share", "one", "pool", "of", "memory", "while",
    "a", "scheduler", "batches", "their", "tokens",
)


def random_token_prompts(num: int, input_len: int, vocab_size: int, seed: int = 0,
                         range_ratio: float = 0.0) -> list[list[int]]:
    """`num` prompts of random token ids in [0, vocab_size); lengths drawn uniformly from
    input_len x [1 - range_ratio, 1 + range_ratio] (at least 1)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}.")
    rng = random.Random(seed)
    low = max(1, round(input_len * (1 - range_ratio)))
    high = max(low, round(input_len * (1 + range_ratio)))
    return [[rng.randrange(vocab_size) for _ in range(rng.randint(low, high))]
            for _ in range(num)]


def random_text_prompts(num: int, input_len: int, seed: int = 0) -> list[str]:
    """`num` prompts of `input_len` words each (about one token a word)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(input_len)) for _ in range(num)]
