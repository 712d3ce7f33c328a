"""Logprobs of scored tokens and the top-k alternatives, from raw logits, batched.

Responsibility: given [N, V] logits and one scored token per row (the sampled token, or the
actual next prompt token), return that token's logprob and rank and the k most likely tokens
of each row, with one log_softmax and one topk over all N rows.

Must not: apply any sampling transformation (these are the model's raw logprobs), know about
requests, or return anything but tensors (the runner turns them into lists).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprobs:
    """Batched logprobs of N rows (tensors on the logits' device).

    Attributes:
        token_ids: [N, 1 + k] int64: the scored token, then the top-k tokens, best first.
        logprobs: [N, 1 + k] float32, same order.
        ranks: [N] int64: rank of the scored token (1 = most likely).
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor


def _scored(
    logits: torch.Tensor, scored_token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_softmax [N, V], scored ids [N, 1], their logprobs [N, 1], their ranks [N])."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    scored = scored_token_ids.unsqueeze(1)
    scored_logprobs = logprobs.gather(1, scored)
    # Ties share the better rank: a token's rank counts only strictly more likely tokens.
    ranks = (logprobs > scored_logprobs).sum(dim=-1) + 1
    return logprobs, scored, scored_logprobs, ranks


def compute_listed_logprobs(
    logits: torch.Tensor, scored_token_ids: torch.Tensor, listed: torch.Tensor
) -> tuple[TokenLogprobs, torch.Tensor]:
    """Logprobs of `scored_token_ids` and of the `listed` token ids ([L] int64, the same
    for every row: a request's logprob_token_ids), with the listed tokens' ranks ([N, L])."""
    logprobs, scored, scored_logprobs, ranks = _scored(logits, scored_token_ids)
    listed_ids = listed.unsqueeze(0).expand(logprobs.shape[0], -1)  # [N, L]
    listed_logprobs = logprobs.gather(1, listed_ids)  # [N, L]
    # Rank = 1 + the tokens strictly more likely: from one sort, for any L.
    ascending = logprobs.sort(dim=-1).values
    greater = logprobs.shape[-1] - torch.searchsorted(ascending, listed_logprobs, right=True)
    listed_ranks = greater + 1  # [N, L]
    result = TokenLogprobs(
        token_ids=torch.cat([scored, listed_ids], dim=1),
        logprobs=torch.cat([scored_logprobs, listed_logprobs], dim=1),
        ranks=ranks,
    )
    return result, listed_ranks


def compute_token_logprobs(
    logits: torch.Tensor, scored_token_ids: torch.Tensor, num_top: int
) -> TokenLogprobs:
    """Logprobs of `scored_token_ids` and the `num_top` most likely tokens of each row.

    Args:
        logits: [N, V] raw logits (any float dtype; computed in float32).
        scored_token_ids: [N] int64, the token each row is scored on.
        num_top: k, the number of top tokens per row (0 for none; at most V).
    """
    logprobs, scored, scored_logprobs, ranks = _scored(logits, scored_token_ids)
    if num_top <= 0:
        return TokenLogprobs(scored, scored_logprobs, ranks)
    top_logprobs, top_ids = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)  # [N, k]
    return TokenLogprobs(
        token_ids=torch.cat([scored, top_ids], dim=1),  # [N, 1 + k]
        logprobs=torch.cat([scored_logprobs, top_logprobs], dim=1),  # [N, 1 + k]
        ranks=ranks,
    )
