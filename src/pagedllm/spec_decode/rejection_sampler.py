"""Rejection sampler: verifies draft tokens against the target model, keeping its output exact.

A request with drafts d_1..d_m is scored at m + 1 positions in one step: row j holds the
target's logits for the token after d_1..d_j. Rows are prepared as if each position were a
plain decode (penalties see the drafts before it, min_tokens and seeds count it as the next
output position). Two ways to verify:

- Sample and match, for greedy rows, for seeded rows and for deterministic drafts (n-gram
  lookups): each row draws the token plain decoding would (the argmax, or the inverse-CDF
  sample with the row's uniform), drafts are accepted while they equal those tokens, and the
  first mismatching row's token ends the run. The output is token for token what plain
  decoding gives (seeded rows: the same tokens as without speculation, whatever the batch),
  and a one-hot draft is accepted with probability p(d), as in rejection sampling.
- Rejection sampling, for unseeded random rows whose drafts were sampled from a drafter's
  distribution q: d_j is accepted with probability min(1, p(d_j) / q(d_j)) and the first
  rejected row samples from the residual max(p - q, 0) renormalised (Leviathan et al.;
  Chen et al.): every emitted token is distributed as under p, and more drafts are
  accepted than by matching.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedllm.layers.sampler import (
    Sampler,
    SamplingMetadata,
    row_uniforms,
    sample_inverse_cdf,
)


@dataclass
class DraftLayout:
    """Where each request's rows lie in the verification batch.

    Attributes:
        draft_token_ids: per request, its drafts (possibly none).
        row_starts: per request, its first row; it has len(drafts) + 1 rows.
        draft_rows: [M] the row of every draft token, request by request.
    """

    draft_token_ids: list[list[int]]
    row_starts: np.ndarray
    draft_rows: np.ndarray

    @classmethod
    def build(cls, draft_token_ids: list[list[int]]) -> DraftLayout:
        """The layout of requests with these drafts, in order."""
        if not any(draft_token_ids):  # a plain step: one row per request
            rows = np.arange(len(draft_token_ids), dtype=np.int64)
            return cls(draft_token_ids, rows, np.zeros(0, dtype=np.int64))
        num_rows = np.array([len(d) + 1 for d in draft_token_ids], dtype=np.int64)
        row_starts = np.zeros(len(num_rows), dtype=np.int64)
        np.cumsum(num_rows[:-1], out=row_starts[1:])
        draft_rows = np.concatenate(
            [np.arange(s, s + n - 1) for s, n in zip(row_starts, num_rows, strict=True)]
            or [np.zeros(0, dtype=np.int64)]
        ).astype(np.int64)
        return cls(draft_token_ids, row_starts, draft_rows)

    @property
    def num_rows(self) -> int:
        """Rows of the batch (drafts + one per request)."""
        return len(self.draft_rows) + len(self.draft_token_ids)

    def flat_drafts(self) -> list[int]:
        """Every draft token, request by request."""
        return [t for drafts in self.draft_token_ids for t in drafts]

    def outputs(self, accepted: list[bool], final_tokens: list[int]) -> list[list[int]]:
        """Per request: its accepted drafts, then the token of its first rejected row (or
        of its bonus row when all were accepted)."""
        results: list[list[int]] = []
        position = 0
        for start, drafts in zip(self.row_starts.tolist(), self.draft_token_ids, strict=True):
            num_accepted = 0
            while num_accepted < len(drafts) and accepted[position + num_accepted]:
                num_accepted += 1
            position += len(drafts)
            results.append(drafts[:num_accepted] + [final_tokens[start + num_accepted]])
        return results


def accept_greedy(layout: DraftLayout, target_tokens: list[int]) -> list[list[int]]:
    """Greedy verification from the target's argmax of every row."""
    accepted = [
        target_tokens[row] == token
        for row, token in zip(layout.draft_rows.tolist(), layout.flat_drafts(), strict=True)
    ]
    return layout.outputs(accepted, target_tokens)


class RejectionSampler:
    """Verifies drafts from the target's logits; see the module docstring."""

    def __call__(
        self,
        logits: torch.Tensor,
        metadata: SamplingMetadata,
        layout: DraftLayout,
        draft_probs: torch.Tensor | None = None,
    ) -> list[list[int]]:
        """The tokens each request emits this step: its accepted drafts plus one.

        Args:
            logits: [R, V] float32 target logits of the layout's rows (not modified).
            metadata: sampling settings of those R rows (row j of a request prepared as the
                decode of its output position n + j).
            layout: the requests' drafts and rows.
            draft_probs: [M, V] the drafter's distribution at each draft token's position,
                None when every draft is deterministic (one-hot): then every row matches.
        """
        processed = Sampler.process_logits(logits, metadata)
        if metadata.all_greedy:
            return accept_greedy(layout, processed.argmax(dim=-1).tolist())
        device = logits.device
        weights = Sampler.random_weights(processed, metadata)  # [R, V]
        # Seeded rows: the first draw samples (as plain decoding would), the second accepts.
        sample_uniform = row_uniforms(layout.num_rows, metadata.generators, device)  # [R]
        is_greedy = metadata.greedy_rows()  # [R]
        # What each row draws as plain decoding: a verification of no drafts is a step.
        plain = sample_inverse_cdf(weights, sample_uniform)  # [R]
        if not metadata.all_random:
            plain = torch.where(is_greedy, processed.argmax(dim=-1), plain)
        if draft_probs is None:
            return accept_greedy(layout, plain.tolist())  # sample and match
        accept_uniform = row_uniforms(layout.num_rows, metadata.generators, device)  # [R]
        probs = weights / weights.sum(dim=-1, keepdim=True)  # [R, V]
        rows = torch.from_numpy(layout.draft_rows).to(device)  # [M]
        drafts = torch.tensor(layout.flat_drafts(), dtype=torch.int64, device=device)  # [M]
        target_p = probs[rows, drafts]  # [M]
        draft_p = draft_probs[torch.arange(len(drafts), device=device), drafts]  # [M]
        # u < p / q, written without a division (q > 0: the draft was drawn from q).
        accept_random = accept_uniform[rows] * draft_p < target_p  # [M]
        matches = metadata.seeded_rows(layout.num_rows) | is_greedy  # [R]
        accepted = torch.where(matches[rows], drafts == plain[rows], accept_random)  # [M]
        # What a rejected row emits: a draw from max(p - q, 0); a bonus row draws from p.
        residual = probs.clone()
        residual[rows] = (probs[rows] - draft_probs).clamp_(min=0.0)
        # p == q leaves nothing, but then the draft is always accepted: keep p for safety.
        empty = residual.sum(dim=-1) <= 0  # [R]
        residual = torch.where(empty.unsqueeze(1), probs, residual)
        # Rows that get here are unseeded: a fresh draw, independent of the acceptance one.
        fresh = torch.rand(layout.num_rows, dtype=torch.float64, device=device)  # [R]
        resampled = sample_inverse_cdf(residual, fresh)  # [R]
        final = torch.where(matches, plain, resampled)  # [R]
        return layout.outputs(accepted.tolist(), final.tolist())
