"""The sampling pipeline: a step's logits rows to the tokens each request emits.

One pipeline serves every step: a plain step is a verification of drafts of length 0.
Each request that samples has 1 + len(drafts) rows (spec_decode/rejection_sampler.py
DraftLayout; one row without drafts), prepared as decodes of consecutive output
positions. In order:
1. the rows' hidden states;
2. plain greedy rows without logprobs, processors, grammars or a min_tokens mask: the LM
   head picks each row's argmax directly (no [rows, vocab] float32 logits) and marks the
   rows that are not finite (-1), drafts accepted while they match;
3. otherwise which rows are finite (read after the tokens' copy: no extra host sync), the
   logits (the LM head's shortlist where only argmaxes are used, e.g.
   greedy rows under min_tokens; non-finite rows zeroed on the device), the grammar
   bitmask of constrained rows, then the rejection sampler (sample-and-match; rejection
   sampling against a drafter's distribution), and the raw logprobs of every emitted
   token;
4. the requests whose rows were not finite, to fail alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pagedllm.layers.logits_processors import adjusts_logits
from pagedllm.layers.logprobs import compute_listed_logprobs, compute_token_logprobs
from pagedllm.layers.sampler import min_tokens_banned
from pagedllm.logits_processor import CustomLogitsProcessors
from pagedllm.spec_decode.rejection_sampler import DraftLayout, RejectionSampler, accept_greedy
from pagedllm.spec_decode.verify import build_verify_metadata
from pagedllm.structured_output.bitmask import apply_grammar_bitmask
from pagedllm.worker.input_batch import CachedRequestState
from pagedllm.worker.logprobs import resolve_num_top, split_logprobs
from pagedllm.worker.nonfinite import finite_rows, nonfinite_rows, owners_of_rows
from pagedllm.worker.outputs import LogprobsLists
from pagedllm.worker.step_hooks.base import RunnerStep

if TYPE_CHECKING:
    from pagedllm.models.interfaces import CausalLM


@dataclass
class SampleResult:
    """What the sample rows of a step emit.

    Attributes:
        emitted: per sample row, its tokens (accepted drafts, then one).
        logprobs: request id → logprobs of its emitted tokens, for requests that ask.
        failed: indices into the sample rows whose forward was not finite.
    """

    emitted: list[list[int]] = field(default_factory=list)
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    failed: list[int] = field(default_factory=list)


class SamplingPipeline:
    """Samples (verifies) the rows of a step; see the module docstring.

    Args:
        model: the causal LM (its `compute_logits` and `compute_greedy_tokens`).
        device: where the logits live.
        samples: False on ranks that compute the logits (a collective) but leave sampling
            to the driver rank.
    """

    def __init__(self, model: CausalLM, device: torch.device, samples: bool = True,
                 custom: CustomLogitsProcessors | None = None) -> None:
        self.model = model
        self.device = device
        self.samples = samples
        # The engine's logits-processor plugins (logits_processor/), applied batch-wise.
        self.custom = custom
        self.rejection_sampler = RejectionSampler()
        # request id -> [drafts, vocab] the distribution its pending drafts were drawn from
        # (recorded by the speculative decoding hook).
        self.draft_probs: dict[str, torch.Tensor] = {}

    def sample(self, step: RunnerStep, hidden_states: torch.Tensor) -> SampleResult:
        """The tokens each sample row of `step` emits (see the module docstring)."""
        inputs = step.inputs
        if not inputs.sample_rows:
            return SampleResult()
        states = [step.states[row] for row in inputs.sample_rows]
        drafts = inputs.draft_token_ids
        layout = DraftLayout.build(drafts)
        constrained = step.scheduler_output.structured_output_request_ids
        rows_hidden = _sample_rows_hidden(step, hidden_states)
        custom = self.custom
        plugins_bind = custom is not None and not custom.argmax_invariant
        if not constrained and not plugins_bind and all(only_argmax(s) for s in states):
            # No sampling metadata needed: the LM head picks each row's argmax directly,
            # and marks the rows that are not finite (-1) on the way.
            tokens = self.model.compute_greedy_tokens(rows_hidden).tolist()
            failed: list[int] = []
            if min(tokens, default=0) < 0:
                failed = owners_of_rows([r for r, t in enumerate(tokens) if t < 0],
                                        layout.row_starts)
                # A valid id in their place until the runner takes them back (the step's
                # hooks, a drafter among them, read the emitted tokens first).
                tokens = [max(t, 0) for t in tokens]
            return SampleResult(accept_greedy(layout, tokens), {}, failed)
        finite = finite_rows(rows_hidden)
        metadata = build_verify_metadata(
            [s.sampling_params for s in states], [s.num_output_tokens for s in states],
            [s.eos_token_id for s in states], [s.token_ids for s in states],
            [s.num_prompt_tokens for s in states], drafts, self.device,
        )
        # Plain greedy rows without logprobs use nothing but the argmax, here under a
        # min_tokens mask. (A grammar may forbid every shortlisted candidate: constrained
        # steps need all logits.)
        argmax_only = (
            metadata.all_greedy
            and metadata.logits_processors is None
            and not constrained
            and custom is None
            and all(s.sampling_params.logprobs is None for s in states)
        )
        # Rows whose forward went non-finite get zero logits on the device (no host sync
        # before sampling): finite values keep the sampler's math sound; their requests
        # fail (read after the tokens' copy).
        logits = self.model.compute_logits(rows_hidden, argmax_only).float()
        logits.masked_fill_(~finite.unsqueeze(1), 0.0)  # [rows, vocab]
        if custom is not None:  # one row per request: plugins and drafts do not mix
            logits = custom.apply(states, logits)
        if constrained:  # a bitmask row for each position a constrained request verifies
            index = {s.request_id: i for i, s in enumerate(states)}
            rows = [
                int(layout.row_starts[index[request_id]]) + j
                for request_id in constrained
                for j in range(len(drafts[index[request_id]]) + 1)
            ]
            apply_grammar_bitmask(logits, step.scheduler_output.grammar_bitmask, rows)
        if not self.samples:  # the driver samples (the logits above were collective)
            return SampleResult([[] for _ in states])
        draft_probs = self._pending_draft_probs(states, drafts, logits.shape[-1])
        emitted = self.rejection_sampler(logits, metadata, layout, draft_probs)
        row_starts = layout.row_starts.tolist()
        logprobs = _emitted_logprobs(states, logits, row_starts, emitted)
        return SampleResult(emitted, logprobs, _failed(finite, layout))

    def _pending_draft_probs(
        self, states: list[CachedRequestState], drafts: list[list[int]], vocab_size: int
    ) -> torch.Tensor | None:
        """[M, vocab] the drafter's distribution at every verified draft (one-hot where the
        drafts were deterministic); None when all were (or there are no drafts)."""
        # Popped whether verified or not: drafts this step does not verify are dropped.
        probs = [self.draft_probs.pop(s.request_id, None) for s in states]
        if all(p is None for p in probs) or not any(drafts):
            return None
        rows = []
        for p, request_drafts in zip(probs, drafts, strict=True):
            if not request_drafts:
                continue
            if p is None:  # deterministic drafts: all the mass on the draft
                p = torch.zeros(len(request_drafts), vocab_size, device=self.device)
                p[torch.arange(len(request_drafts)), torch.tensor(request_drafts)] = 1.0
            rows.append(p[: len(request_drafts)].float())  # the scheduler may cut drafts
        return torch.cat(rows)


def only_argmax(state: CachedRequestState) -> bool:
    """Whether a request's rows this step need nothing but their argmax: greedy, without
    logprobs or logits adjustments, past its min_tokens (at its first row this step, so at
    every later one)."""
    params = state.sampling_params
    return (
        params.is_greedy
        and params.logprobs is None
        and not adjusts_logits(params)
        and not min_tokens_banned(params, state.num_output_tokens, state.eos_token_id)
    )


def _sample_rows_hidden(step: RunnerStep, hidden_states: torch.Tensor) -> torch.Tensor:
    """The hidden states of the rows to sample ([rows, hidden]): all of them, in order,
    at a decode step (no copy), else the selected ones."""
    indices = step.inputs.logits_indices  # strictly increasing
    count = len(indices)
    if count == hidden_states.shape[0] and (count == 0 or indices[-1] == count - 1):
        return hidden_states  # so 0, 1, ..., count - 1
    return hidden_states[step.to_device(indices)]


def _failed(finite: torch.Tensor, layout: DraftLayout) -> list[int]:
    """The requests (indices into the sample rows) owning a non-finite row."""
    bad_rows = nonfinite_rows(finite)
    return owners_of_rows(bad_rows, layout.row_starts) if bad_rows else []


def _emitted_logprobs(
    states: list[CachedRequestState],
    logits: torch.Tensor,
    row_starts: list[int],
    emitted: list[list[int]],
) -> dict[str, LogprobsLists]:
    """Raw logprobs (+ top-k) of every emitted token at its own logits row (request i's
    tokens at rows row_starts[i], +1, ...), for the requests that ask; one log_softmax and
    one topk (k = the largest asked) over all of them. A request listing logprob_token_ids
    gets those ids' logprobs instead of the top-k (its own gather)."""
    asking = [i for i, s in enumerate(states) if s.sampling_params.logprobs is not None]
    listed = [i for i in asking if states[i].sampling_params.logprob_token_ids]
    result_lists = {
        states[i].request_id: _listed_logprobs(logits, row_starts[i], emitted[i],
                                               states[i].sampling_params.logprob_token_ids)
        for i in listed
    }
    asking = [i for i in asking if i not in listed]
    if not asking:
        return result_lists
    vocab_size = logits.shape[-1]
    rows = [row_starts[i] + j for i in asking for j in range(len(emitted[i]))]
    tokens = [t for i in asking for t in emitted[i]]
    num_top = [
        resolve_num_top(states[i].sampling_params.logprobs or 0, vocab_size) for i in asking
    ]
    index = torch.tensor(rows, device=logits.device)
    token_tensor = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
    result = compute_token_logprobs(logits[index], token_tensor, max(num_top))
    lists = split_logprobs(result, [len(emitted[i]) for i in asking], num_top)
    result_lists.update(
        {states[i].request_id: lp for i, lp in zip(asking, lists, strict=True)}
    )
    return result_lists


def _listed_logprobs(
    logits: torch.Tensor, row_start: int, emitted: list[int], listed: list[int] | None
) -> LogprobsLists:
    """One request's emitted tokens with the logprobs (and ranks) of its logprob_token_ids
    instead of the top-k (vLLM's logprob_token_ids)."""
    device = logits.device
    rows = torch.arange(row_start, row_start + len(emitted), device=device)
    result, listed_ranks = compute_listed_logprobs(
        logits[rows], torch.tensor(emitted, dtype=torch.int64, device=device),
        torch.tensor(listed or [], dtype=torch.int64, device=device),
    )
    return LogprobsLists(result.token_ids.tolist(), result.logprobs.tolist(),
                         result.ranks.tolist(), listed_ranks.tolist())
