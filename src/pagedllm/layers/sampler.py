"""Sampler: turn a batch of next-token logits into token ids, one per row.

Responsibility: greedy argmax, temperature, top-k / top-p / min-p truncation, min-tokens
masking and per-request seeded sampling, all vectorised over the batch. `SamplingMetadata`
packs a step's per-request `SamplingParams` into tensors once per step. Penalties, biases,
allowed tokens and bad words are applied first (layers/logits_processors.py); logprobs are
taken from the raw logits by the caller (layers/logprobs.py), not here.

Must not: know about requests, blocks or the scheduler; keep state between steps (a seeded
row's randomness is derived from its seed and output position, so preemption and recompute
replay the same tokens); modify the caller's logits tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pagedllm.layers.logits_processors import LogitsProcessors
from pagedllm.platform import get_platform
from pagedllm.sampling_params import SamplingParams

# Below this temperature a row is greedy (the same threshold as SamplingParams.is_greedy).
_SAMPLING_EPS = 1e-5
_MASK64 = (1 << 64) - 1
# Top-p on CPU first looks for its cut among this many most likely tokens: torch's CPU sort of
# a whole [B, V] row batch is several times slower than a partial top-k selection.
_TOP_P_CANDIDATES = 4096


def _splitmix64(x: int) -> int:
    """One round of SplitMix64: a cheap, well-mixed 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(seed: int, position: int) -> int:
    """The generator seed for sampling output token `position` of a request seeded `seed`.

    Hashing (seed, position) instead of advancing one long-lived generator makes the token at
    each position reproducible on its own: after preemption the recomputed request draws the
    same noise, and neighbours in the batch never consume a row's randomness.
    """
    mixed = _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))
    # torch.Generator.manual_seed accepts any 64-bit value; keep it non-negative and < 2**63.
    return mixed >> 1


def _generator_for(seed: int, position: int) -> torch.Generator:
    generator = torch.Generator()  # CPU: see row_uniforms
    generator.manual_seed(derive_seed(seed, position))
    return generator


@dataclass
class SamplingMetadata:
    """Sampling settings of one step's batch of B rows, as tensors on the sampling device.

    Attributes:
        temperature: [B] float32; rows below 1e-5 are greedy.
        all_greedy: every row is greedy (the sampler takes a pure argmax path).
        all_random: no row is greedy.
        top_k: [B] int64, 0 meaning "off"; None when no random row uses top-k.
        max_top_k: the largest top_k of any row (0 when top_k is None), known on the host
            so the sampler needs no device sync to size its partial top-k selection.
        top_p: [B] float32, 1.0 meaning "off"; None when no random row uses top-p.
        min_p: [B] float32, 0.0 meaning "off"; None when no random row uses min-p.
        generators: row index -> CPU generator for seeded random rows, freshly derived from
            (seed, num_output_tokens), so the row's draw depends on nothing else.
        min_tokens_mask: (row indices [N] int64, token ids [N] int64) pairs that must not be
            sampled this step (EOS and stop_token_ids of rows still below min_tokens); None
            when no row is below its min_tokens.
        logits_processors: allowed tokens, bad words, logit bias and penalties of the rows
            that use them; None when no row does.
    """

    temperature: torch.Tensor
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None
    max_top_k: int = 0
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    min_tokens_mask: tuple[torch.Tensor, torch.Tensor] | None = None
    logits_processors: LogitsProcessors | None = None

    def greedy_rows(self) -> torch.Tensor:
        """[B] bool: the rows sampled greedily."""
        return self.temperature < _SAMPLING_EPS

    def seeded_rows(self, batch_size: int) -> torch.Tensor:
        """[B] bool: the random rows with their own seed."""
        seeded = torch.zeros(batch_size, dtype=torch.bool, device=self.temperature.device)
        if self.generators:
            seeded[list(self.generators)] = True
        return seeded

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        num_output_tokens: list[int],
        eos_token_ids: list[int | None],
        device: torch.device | str,
        token_ids: Sequence[Sequence[int]] | None = None,
        num_prompt_tokens: Sequence[int] | None = None,
    ) -> SamplingMetadata:
        """Pack one step's rows into tensors; features no random row uses stay None.

        Args:
            params: the sampling parameters of each row, in batch order.
            num_output_tokens: per row, output tokens generated so far (= the output position
                of the token about to be sampled).
            eos_token_ids: per row, the EOS id, or None when the model has none.
            device: where the sampler runs.
            token_ids / num_prompt_tokens: per row, prompt + output ids so far and the
                prompt's length; read only for rows with penalties or bad words.
        """
        assert len(params) == len(num_output_tokens) == len(eos_token_ids)
        device = torch.device(device)
        temperatures = [p.temperature for p in params]
        greedy = [t < _SAMPLING_EPS for t in temperatures]
        num_greedy = sum(greedy)
        random_rows = [i for i, is_greedy in enumerate(greedy) if not is_greedy]
        top_k = top_p = min_p = None
        max_top_k = 0
        generators: dict[int, torch.Generator] = {}
        # Greedy rows ignore every random-sampling feature, so only random rows switch one on.
        if any(params[i].top_k > 0 for i in random_rows):
            values = [
                0 if g or p.top_k < 0 else p.top_k for p, g in zip(params, greedy, strict=True)
            ]
            top_k = torch.tensor(values, dtype=torch.int64, device=device)
            max_top_k = max(values)
        if any(params[i].top_p < 1.0 for i in random_rows):
            values_p = [1.0 if g else p.top_p for p, g in zip(params, greedy, strict=True)]
            top_p = torch.tensor(values_p, dtype=torch.float32, device=device)
        if any(params[i].min_p > 0.0 for i in random_rows):
            values_p = [0.0 if g else p.min_p for p, g in zip(params, greedy, strict=True)]
            min_p = torch.tensor(values_p, dtype=torch.float32, device=device)
        for i in random_rows:
            seed = params[i].seed
            if seed is not None:
                generators[i] = _generator_for(seed, num_output_tokens[i])
        return cls(
            temperature=torch.tensor(temperatures, dtype=torch.float32, device=device),
            all_greedy=num_greedy == len(params),
            all_random=num_greedy == 0,
            top_k=top_k,
            max_top_k=max_top_k,
            top_p=top_p,
            min_p=min_p,
            generators=generators,
            min_tokens_mask=_build_min_tokens_mask(
                params, num_output_tokens, eos_token_ids, device
            ),
            logits_processors=LogitsProcessors.build(params, token_ids, num_prompt_tokens, device),
        )


def min_tokens_banned(params: SamplingParams, num_output_tokens: int, eos_token_id: int | None
                      ) -> set[int]:
    """The tokens a request may not sample at output position `num_output_tokens` because
    they would end it before its min_tokens (empty from min_tokens on)."""
    if num_output_tokens >= params.min_tokens:
        return set()
    banned = set(params.stop_token_ids or ())
    # With ignore_eos the EOS token does not stop the request, so it need not be banned.
    if eos_token_id is not None and not params.ignore_eos:
        banned.add(eos_token_id)
    return banned


def _build_min_tokens_mask(
    params: list[SamplingParams],
    num_output_tokens: list[int],
    eos_token_ids: list[int | None],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows, token ids) that would end a request before its min_tokens, or None."""
    rows: list[int] = []
    token_ids: list[int] = []
    for i, (p, num_out, eos) in enumerate(
        zip(params, num_output_tokens, eos_token_ids, strict=True)
    ):
        banned = min_tokens_banned(p, num_out, eos)
        rows.extend([i] * len(banned))
        token_ids.extend(banned)
    if not rows:
        return None
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(token_ids, dtype=torch.int64, device=device),
    )


class Sampler(nn.Module):
    """Samples one token per row from [B, V] logits according to `SamplingMetadata`.

    Greedy rows return exactly `argmax` of the (min-tokens-masked) logits. Random rows work
    on unnormalised probabilities w = exp((logit - max) / T), keep the tokens that pass top-k,
    top-p and min-p (in that order), and sample by inverting the CDF with one uniform per row:
    the first token whose cumulative weight exceeds u * sum(w). Seeded rows draw u from their
    own generator, every other row shares one batched draw.

    Inverting the CDF needs one uniform per row and one cumsum pass instead of a uniform, a
    log and a division per token (an exponential race): about 4x cheaper on CPU.
    """

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """Return the sampled token ids, [B] int64; `logits` ([B, V] float32) is not modified."""
        logits = self.process_logits(logits, metadata)
        if metadata.all_greedy:
            return logits.argmax(dim=-1)  # [B]
        weights = self.random_weights(logits, metadata)  # [B, V]
        uniform = row_uniforms(weights.shape[0], metadata.generators, weights.device)  # [B]
        sampled = sample_inverse_cdf(weights, uniform)  # [B]
        if metadata.all_random:
            return sampled
        is_greedy = metadata.temperature < _SAMPLING_EPS  # [B]
        return torch.where(is_greedy, logits.argmax(dim=-1), sampled)

    @staticmethod
    def process_logits(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """The logits after penalties, biases, allowed tokens, bad words and min_tokens
        (a new tensor when any applies; `logits` itself is never modified)."""
        if metadata.logits_processors is not None:
            logits = metadata.logits_processors.apply(logits)  # a new [B, V] tensor
        if metadata.min_tokens_mask is not None:
            rows, token_ids = metadata.min_tokens_mask
            minus_inf = torch.tensor(-math.inf, device=logits.device)
            logits = logits.index_put((rows, token_ids), minus_inf)
        return logits

    @staticmethod
    def random_weights(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """[B, V] unnormalised probabilities of processed `logits` after temperature, top-k,
        top-p and min-p (max 1 per row; greedy rows as if at temperature 1)."""
        temperature = metadata.temperature
        if not metadata.all_random:
            # Greedy rows are sampled too (their result is discarded); avoid dividing by 0.
            temperature = temperature.masked_fill(temperature < _SAMPLING_EPS, 1.0)
        row_max = logits.amax(dim=-1, keepdim=True)  # [B, 1]
        # Unnormalised probabilities, max 1 per row: sampling is invariant to each row's
        # scale, and every filter is monotone in the logit, so no softmax and no logit copy.
        weights = (logits - row_max).div_(temperature.unsqueeze(1)).exp_()  # [B, V]
        threshold = _keep_threshold(weights, metadata)  # [B] or None
        if threshold is not None:
            weights.masked_fill_(weights < threshold.unsqueeze(1), 0.0)
        return weights


def sample_inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of [B, V] non-negative `weights` (not all zero) from [B] float64
    uniforms: the first token whose cumulative weight exceeds u * sum(w)."""
    # float64 so that tail tokens are not absorbed by a large running sum.
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)  # [B, V]
    total = cdf[:, -1]  # [B]
    # Stay strictly below the total, so the search never runs past the last kept token.
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    # right=True: the first index whose cdf exceeds the target, never a zero-weight token
    # (its cdf equals its predecessor's), even for a target of exactly 0.
    return torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)  # [B]


def _keep_threshold(weights: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor | None:
    """Per row, the smallest weight that survives top-k, top-p and min-p; None if all are off.

    Each filter keeps the tokens whose weight is at least some value, so the three collapse
    into one threshold per row and are applied in a single masking pass, never unsorted back.
    Tokens tied with the threshold are all kept.
    """
    top_k, top_p, min_p = metadata.top_k, metadata.top_p, metadata.min_p
    if top_k is None and top_p is None and min_p is None:
        return None
    batch_size, vocab_size = weights.shape
    threshold = torch.zeros(batch_size, device=weights.device)  # [B], 0 keeps everything
    if top_p is not None:
        # Rows without top-k keep k = V, so top-k leaves them untouched.
        k = torch.full((batch_size,), vocab_size, dtype=torch.int64, device=weights.device)
        if top_k is not None:
            k = torch.where(top_k > 0, top_k.clamp(max=vocab_size), k)  # [B]
        threshold = _top_k_top_p_threshold(weights, k, top_p)
    elif top_k is not None:
        threshold = _top_k_threshold(weights, top_k, metadata.max_top_k)
    if min_p is not None:
        # p_i >= min_p * p_max, and every row's largest weight is exactly 1.
        threshold = torch.maximum(threshold, min_p)
    return threshold


def _top_k_threshold(weights: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Per row, the k-th largest weight (0 for rows with top-k off), without a full sort."""
    vocab_size = weights.shape[-1]
    # A partial selection of the largest max(k) is much cheaper than sorting all V.
    largest = weights.topk(min(max_top_k, vocab_size), dim=-1).values  # [B, max_k]
    index = (top_k.clamp(max=largest.shape[-1]) - 1).clamp_(min=0)  # [B]
    kth = largest.gather(1, index.unsqueeze(1)).squeeze(1)  # [B]
    return kth.masked_fill_(top_k <= 0, 0.0)


def _top_k_top_p_threshold(
    weights: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Per row, the last kept weight after top-k then top-p.

    On GPU one descending sort of every row. On CPU the cut is first sought among the
    `_TOP_P_CANDIDATES` largest weights, and only rows whose kept set reaches past them are
    sorted in full (flat distributions), which gives the same threshold.
    """
    vocab_size = weights.shape[-1]
    if not get_platform(weights.device).full_sort_is_slow or vocab_size <= 2 * _TOP_P_CANDIDATES:
        sorted_weights = weights.sort(dim=-1, descending=True).values  # [B, V]
        return _threshold_from_sorted(sorted_weights, vocab_size, None, k, top_p)[0]
    total = weights.sum(dim=-1)  # [B]
    candidates = weights.topk(_TOP_P_CANDIDATES, dim=-1).values  # [B, C], descending
    threshold, is_exact = _threshold_from_sorted(candidates, vocab_size, total, k, top_p)
    if not bool(is_exact.all()):
        rows = (~is_exact).nonzero().squeeze(1)  # [R]
        sorted_weights = weights[rows].sort(dim=-1, descending=True).values  # [R, V]
        threshold[rows] = _threshold_from_sorted(
            sorted_weights, vocab_size, None, k[rows], top_p[rows]
        )[0]
    return threshold


def _threshold_from_sorted(
    sorted_weights: torch.Tensor,
    vocab_size: int,
    total: torch.Tensor | None,
    k: torch.Tensor,
    top_p: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k then top-p cut from each row's C largest weights (C may be all of V).

    Args:
        sorted_weights: [B, C] the largest weights of each row, descending.
        vocab_size: V.
        total: [B] each row's full weight sum; needed only when C < V.
        k: [B] in [1, V]. top_p: [B], 1.0 meaning off.

    Returns:
        (threshold [B], is_exact [B]): is_exact is False where the cut may lie beyond C.
    """
    num_candidates = sorted_weights.shape[-1]
    ranks = torch.arange(num_candidates, device=sorted_weights.device)  # [C]
    kept = sorted_weights.masked_fill(ranks.unsqueeze(0) >= k.unsqueeze(1), 0.0)  # [B, C]
    cumulative = kept.cumsum(dim=-1)  # [B, C]
    # Top-p is taken over the mass that top-k left, renormalised.
    is_k_inside = k <= num_candidates  # [B]
    mass = cumulative[:, -1]  # [B]
    if total is not None:
        mass = torch.where(is_k_inside, mass, total)
    target = top_p * mass  # [B]
    # A token is kept while the mass strictly before it is still below top_p: the smallest
    # prefix whose mass reaches top_p, and always at least the most likely token.
    num_keep = ((cumulative - kept) < target.unsqueeze(1)).sum(dim=-1).clamp_(min=1)  # [B]
    is_top_p_off = top_p >= 1.0
    # Rounding in the cumsum must not drop tail tokens of rows that disabled top-p.
    num_keep = torch.where(is_top_p_off, k, torch.minimum(num_keep, k))  # [B]
    is_exact = torch.where(
        is_top_p_off,
        is_k_inside | (k >= vocab_size),
        is_k_inside | (num_keep < num_candidates) | (cumulative[:, -1] >= target),
    )
    index = (num_keep - 1).clamp_(max=num_candidates - 1).unsqueeze(1)  # [B, 1]
    threshold = sorted_weights.gather(1, index).squeeze(1)  # [B]
    # Keep-everything rows must not be cut at the C-th candidate.
    return threshold.masked_fill_(num_keep >= vocab_size, 0.0), is_exact


def row_uniforms(
    batch_size: int, generators: dict[int, torch.Generator], device: torch.device
) -> torch.Tensor:
    """One Uniform[0, 1) float64 per row; seeded rows draw theirs from their own generator."""
    uniform = torch.rand(batch_size, dtype=torch.float64, device=device)  # [B]
    if generators:
        rows = list(generators)
        # Seeded generators live on the CPU: the same seed gives the same draw on any device.
        seeded = torch.cat(
            [torch.rand(1, dtype=torch.float64, generator=g) for g in generators.values()]
        )  # [S]
        uniform[torch.tensor(rows, device=device)] = seeded.to(device)
    return uniform
