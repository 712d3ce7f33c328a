"""Per-request logits adjustments before sampling: allowed tokens, bad words, bias, penalties.

Responsibility: pack one step's `allowed_token_ids`, `bad_words`, `logit_bias` and the
presence / frequency / repetition penalties into tensors (only for the rows that use them)
and apply them to a [B, V] logits batch with a few vectorised ops.

Order and semantics (vLLM's): tokens outside `allowed_token_ids` and banned bad-word
completions get -inf (masks commute with everything after them); then `logit_bias` is added;
then the repetition penalty (HF: for every token seen in the prompt or the output, a positive
logit is divided by the penalty, a non-positive one multiplied); then frequency and presence
(OpenAI, output tokens only: logit -= frequency * count + presence * (count > 0)).

Must not: modify the caller's tensor, keep state between steps, or know about requests
beyond the token ids and parameters it is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedllm.sampling_params import SamplingParams

# (row indices [N], token ids [N]) pairs, int64 tensors.
IndexPairs = tuple[torch.Tensor, torch.Tensor]


def adjusts_logits(params: SamplingParams) -> bool:
    """Whether a request uses any adjustment of this module (allowed tokens, bad words,
    bias, penalties); LogitsProcessors.build returns None for steps where none does."""
    return bool(
        params.allowed_token_ids
        or params.bad_words_token_ids
        or params.logit_bias
        or params.has_penalties
    )


@dataclass
class PenaltyTensors:
    """Penalties of the R rows that use any, as tensors.

    Attributes:
        rows: [R] batch rows.
        prompt_pairs: (index into R, token id) for each prompt token of the R rows; None
            when no row has a repetition penalty (prompt tokens matter only for it).
        output_pairs: (index into R, token id) for each output token; None when no output.
        presence / frequency / repetition: [R] float32.
    """

    rows: torch.Tensor
    prompt_pairs: IndexPairs | None
    output_pairs: IndexPairs | None
    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor


@dataclass
class LogitsProcessors:
    """One step's adjustments; every field is None when no row uses it.

    Attributes:
        allowed: (rows [A], (index into A, allowed token id) pairs): every other token of
            those rows is masked.
        banned: (row, token id) pairs set to -inf (bad-word completions).
        bias: (rows [N], token ids [N], values [N] float32) added to the logits.
        penalties: see PenaltyTensors.
    """

    allowed: tuple[torch.Tensor, IndexPairs] | None = None
    banned: IndexPairs | None = None
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    penalties: PenaltyTensors | None = None

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        token_ids: Sequence[Sequence[int]] | None,
        num_prompt_tokens: Sequence[int] | None,
        device: torch.device,
    ) -> LogitsProcessors | None:
        """Pack the step's rows; None when no row uses any adjustment.

        Args:
            params: per row.
            token_ids: per row, prompt + output tokens so far (needed for penalties and
                bad words only; may be None when no row uses them).
            num_prompt_tokens: per row, how many of `token_ids` are the prompt.
            device: where the logits live.
        """
        # (None whenever no row `adjusts_logits`.)
        uses_history = [p.has_penalties or bool(p.bad_words_token_ids) for p in params]
        if any(uses_history):
            assert token_ids is not None and num_prompt_tokens is not None
        processors = cls(
            allowed=_build_allowed(params, device),
            banned=_build_bad_words(params, token_ids, num_prompt_tokens, device),
            bias=_build_bias(params, device),
            penalties=_build_penalties(params, token_ids, num_prompt_tokens, device),
        )
        if (
            processors.allowed is None
            and processors.banned is None
            and processors.bias is None
            and processors.penalties is None
        ):
            return None
        return processors

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A new [B, V] tensor: `logits` with every adjustment applied."""
        logits = logits.clone()
        minus_inf = torch.tensor(-math.inf, device=logits.device, dtype=logits.dtype)
        if self.allowed is not None:
            rows, (index, token_ids) = self.allowed
            is_banned = torch.ones(
                (len(rows), logits.shape[-1]), dtype=torch.bool, device=logits.device
            )  # [A, V]
            is_banned[index, token_ids] = False
            logits[rows] = logits[rows].masked_fill_(is_banned, -math.inf)
        if self.banned is not None:
            logits.index_put_(self.banned, minus_inf)
        if self.bias is not None:
            rows, token_ids, values = self.bias
            logits.index_put_((rows, token_ids), values.to(logits.dtype), accumulate=True)
        if self.penalties is not None:
            _apply_penalties(logits, self.penalties)
        return logits


def _apply_penalties(logits: torch.Tensor, penalties: PenaltyTensors) -> None:
    """Apply repetition, then frequency and presence penalties in place on `logits`."""
    num_rows, vocab_size = len(penalties.rows), logits.shape[-1]
    selected = logits[penalties.rows]  # [R, V]
    counts = torch.zeros((num_rows, vocab_size), dtype=selected.dtype, device=logits.device)
    if penalties.output_pairs is not None:
        ones = torch.ones(len(penalties.output_pairs[0]), dtype=counts.dtype, device=counts.device)
        counts.index_put_(penalties.output_pairs, ones, accumulate=True)  # [R, V]
    is_in_output = counts > 0  # [R, V]
    if penalties.prompt_pairs is not None:
        is_seen = is_in_output.clone()
        is_seen[penalties.prompt_pairs] = True  # [R, V]
        repetition = penalties.repetition.unsqueeze(1)  # [R, 1]
        penalized = torch.where(selected > 0, selected / repetition, selected * repetition)
        selected = torch.where(is_seen, penalized, selected)
    selected = selected - penalties.frequency.unsqueeze(1) * counts
    selected = selected - penalties.presence.unsqueeze(1) * is_in_output.to(selected.dtype)
    logits[penalties.rows] = selected


def _tensor(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _build_allowed(
    params: Sequence[SamplingParams], device: torch.device
) -> tuple[torch.Tensor, IndexPairs] | None:
    rows = [i for i, p in enumerate(params) if p.allowed_token_ids]
    if not rows:
        return None
    index: list[int] = []
    token_ids: list[int] = []
    for j, row in enumerate(rows):
        allowed = params[row].allowed_token_ids or []
        index.extend([j] * len(allowed))
        token_ids.extend(allowed)
    return _tensor(rows, torch.int64, device), (
        _tensor(index, torch.int64, device),
        _tensor(token_ids, torch.int64, device),
    )


def _build_bad_words(
    params: Sequence[SamplingParams],
    token_ids: Sequence[Sequence[int]] | None,
    num_prompt_tokens: Sequence[int] | None,
    device: torch.device,
) -> IndexPairs | None:
    """Ban the last token of every bad word whose other tokens end the output so far."""
    rows: list[int] = []
    banned: list[int] = []
    for i, p in enumerate(params):
        if not p.bad_words_token_ids:
            continue
        assert token_ids is not None and num_prompt_tokens is not None
        output = token_ids[i][num_prompt_tokens[i] :]
        for word in p.bad_words_token_ids:
            prefix_len = len(word) - 1
            if prefix_len > len(output):
                continue
            if prefix_len == 0 or list(output[len(output) - prefix_len :]) == word[:-1]:
                rows.append(i)
                banned.append(word[-1])
    if not rows:
        return None
    return _tensor(rows, torch.int64, device), _tensor(banned, torch.int64, device)


def _build_bias(
    params: Sequence[SamplingParams], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    rows: list[int] = []
    token_ids: list[int] = []
    values: list[float] = []
    for i, p in enumerate(params):
        for token_id, value in (p.logit_bias or {}).items():
            rows.append(i)
            token_ids.append(token_id)
            values.append(value)
    if not rows:
        return None
    return (
        _tensor(rows, torch.int64, device),
        _tensor(token_ids, torch.int64, device),
        _tensor(values, torch.float32, device),
    )


def _build_penalties(
    params: Sequence[SamplingParams],
    token_ids: Sequence[Sequence[int]] | None,
    num_prompt_tokens: Sequence[int] | None,
    device: torch.device,
) -> PenaltyTensors | None:
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return None
    assert token_ids is not None and num_prompt_tokens is not None
    has_repetition = any(params[i].repetition_penalty != 1.0 for i in rows)
    prompt_index: list[int] = []
    prompt_ids: list[int] = []
    output_index: list[int] = []
    output_ids: list[int] = []
    for j, row in enumerate(rows):
        tokens, split = token_ids[row], num_prompt_tokens[row]
        if has_repetition:
            prompt_index.extend([j] * split)
            prompt_ids.extend(tokens[:split])
        output_index.extend([j] * (len(tokens) - split))
        output_ids.extend(tokens[split:])

    def pairs(index: list[int], ids: list[int]) -> IndexPairs | None:
        if not index:
            return None
        return _tensor(index, torch.int64, device), _tensor(ids, torch.int64, device)

    return PenaltyTensors(
        rows=_tensor(rows, torch.int64, device),
        prompt_pairs=pairs(prompt_index, prompt_ids),
        output_pairs=pairs(output_index, output_ids),
        presence=_tensor([params[i].presence_penalty for i in rows], torch.float32, device),
        frequency=_tensor([params[i].frequency_penalty for i in rows], torch.float32, device),
        repetition=_tensor([params[i].repetition_penalty for i in rows], torch.float32, device),
    )
