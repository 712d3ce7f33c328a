"""Beam search on top of the engine (`LLM.beam_search`), scored as transformers scores it.

Each step, every live beam of every prompt becomes one engine request for a single token
with `logprobs = 2 * beam_width`: the 2W most likely continuations of each beam contain the
2W best continuations overall. The engine runs them all in one continuous batch; this module
only does the bookkeeping, with transformers' `generate(num_beams=W, do_sample=False)`
semantics:

1. Candidates are (beam, token) pairs scored by cumulative raw logprob; the best K = 2W are
   kept, in order.
2. A candidate that ends its beam (EOS unless `ignore_eos`, or the length limit) becomes a
   finished hypothesis only if it is among the first W of the K, scored
   `cum_logprob / num_generated_tokens ** length_penalty` (EOS counted); at most W
   hypotheses are kept, the best by that score.
3. The W best candidates that do not end continue as the live beams.
4. The search ends at the length limit, when `early_stopping=True` and W hypotheses are
   finished, or (transformers' default `early_stopping=False`) once W hypotheses are
   finished and the best live beam, normalised at its current length, cannot beat the worst
   of them (with "never" and a positive length_penalty, normalised at the maximum length).

KV sharing: a beam is resubmitted as prompt + its tokens each step. With prefix caching (on
by default) its full blocks are found by hash and reused, so only its last partial block is
recomputed. Sharing is by block reference counts: a block common to several beams (the prompt
and the tokens they have in common) is held once, with `ref_cnt` = the number of beams using
it, and is freed when the last of them drops it; the partial last block is private to each
beam, which is the effect copy-on-write would have (a beam never writes a shared block).
Without prefix caching the result is the same, only every step recomputes each beam.

The search itself (`_search`) is a generator that knows no engine: `beam_search` drives it
on an LLMEngine (LLM.beam_search), `beam_search_async` on the server's AsyncLLM
(`use_beam_search` in completions and chat).

Must not: touch the scheduler or the worker; it only adds requests and reads outputs.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.outputs import LogprobsDict
from pagedllm.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
)

if TYPE_CHECKING:
    from pagedllm.engine.async_llm import AsyncLLM

_request_counter = itertools.count()


@dataclass
class BeamSearchSequence:
    """One beam (vLLM's shape, plus `score`).

    Attributes:
        tokens: prompt + generated token ids.
        logprobs: per generated token, the logprobs dict of its step (top 2W).
        cum_logprob: sum of the generated tokens' raw logprobs.
        text: generated text (without a final EOS), filled for returned sequences.
        finish_reason: "stop" (EOS) or "length".
        score: the length-normalised score the sequences are ranked by (transformers'
            `sequences_scores`).
    """

    tokens: list[int]
    logprobs: list[LogprobsDict] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    score: float | None = None


@dataclass
class BeamSearchOutput:
    """The beam_width best sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


@dataclass
class _Candidate:
    parent: BeamSearchSequence
    token_id: int
    logprobs: LogprobsDict

    @property
    def cum_logprob(self) -> float:
        return self.parent.cum_logprob + self.logprobs[self.token_id].logprob

    def to_sequence(self) -> BeamSearchSequence:
        return BeamSearchSequence(
            tokens=[*self.parent.tokens, self.token_id],
            logprobs=[*self.parent.logprobs, self.logprobs],
            cum_logprob=self.cum_logprob,
        )


class _BeamSearchInstance:
    """The search state of one prompt."""

    def __init__(self, prompt_token_ids: list[int], max_tokens: int, params: BeamSearchParams):
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.params = params
        self.running = [BeamSearchSequence(tokens=list(prompt_token_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.num_generated = 0
        self.is_done = False

    def advance(self, candidates: list[_Candidate], eos_token_id: int | None) -> None:
        """One search step from every live beam's candidate continuations."""
        width = self.params.beam_width
        candidates.sort(key=lambda c: c.cum_logprob, reverse=True)
        candidates = candidates[: 2 * width]
        is_last = self.num_generated + 1 >= self.max_tokens
        is_eos = [not self.params.ignore_eos and c.token_id == eos_token_id for c in candidates]
        for rank, candidate in enumerate(candidates):
            # Only the W best candidates may finish; the others are backups for live beams.
            if (is_last or is_eos[rank]) and rank < width:
                self._add_finished(candidate, "stop" if is_eos[rank] else "length")
        self.num_generated += 1
        if is_last:
            self.running, self.is_done = [], True
            return
        live = [c for c, eos in zip(candidates, is_eos, strict=True) if not eos]
        self.running = [c.to_sequence() for c in live[:width]]
        self.is_done = not self.running or self._should_stop()

    def _add_finished(self, candidate: _Candidate, finish_reason: str) -> None:
        sequence = candidate.to_sequence()
        sequence.finish_reason = finish_reason
        length = self.num_generated + 1  # generated tokens, EOS included
        sequence.score = sequence.cum_logprob / math.pow(length, self.params.length_penalty)
        self.finished.append(sequence)
        self.finished.sort(key=_score, reverse=True)
        del self.finished[self.params.beam_width :]

    def _should_stop(self) -> bool:
        """transformers' stopping rule: can the best live beam still beat a hypothesis?"""
        params = self.params
        if len(self.finished) < params.beam_width:
            return False
        if params.early_stopping is True:
            return True
        length = self.num_generated
        if params.early_stopping == "never" and params.length_penalty > 0.0:
            length = self.max_tokens
        best_possible = self.running[0].cum_logprob / math.pow(length, params.length_penalty)
        return best_possible <= min(_score(s) for s in self.finished)

    def best_sequences(self) -> list[BeamSearchSequence]:
        """The W best hypotheses, best first (live beams fill in if too few finished)."""
        sequences = list(self.finished)
        for beam in self.running[: self.params.beam_width - len(sequences)]:
            length = max(self.num_generated, 1)
            beam.score = beam.cum_logprob / math.pow(length, self.params.length_penalty)
            beam.finish_reason = "length"
            sequences.append(beam)
        return sorted(sequences, key=_score, reverse=True)


def _score(sequence: BeamSearchSequence) -> float:
    return sequence.score if sequence.score is not None else -math.inf


# One search step's beams (request id -> token ids), and their next-token logprobs back.
StepRequests = dict[str, list[int]]
StepResults = dict[str, LogprobsDict]


def _step_params(width: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        max_tokens=1,
        # 2W candidates per beam (above the engine's max_logprobs: its ValueError, as
        # vLLM's; raise max_logprobs for wider beams).
        logprobs=2 * width,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _search(
    prompts: list[list[int]], params: BeamSearchParams, max_model_len: int,
    eos_token_id: int | None,
) -> Generator[StepRequests, StepResults, list[_BeamSearchInstance]]:
    """The search, engine-free: yields each step's beams, is sent their logprobs, and
    returns the finished instances (the sync and async drivers below run the steps)."""
    instances = [
        _BeamSearchInstance(p, min(params.max_tokens, max_model_len - len(p)), params)
        for p in prompts
    ]
    while live := [inst for inst in instances if not inst.is_done]:
        beams = {
            f"beam-{next(_request_counter)}": (inst, beam) for inst in live for beam in inst.running
        }
        step_logprobs = yield {rid: b.tokens for rid, (_, b) in beams.items()}
        candidates: dict[int, list[_Candidate]] = {id(inst): [] for inst in live}
        for request_id, (inst, beam) in beams.items():
            logprobs = step_logprobs[request_id]
            candidates[id(inst)].extend(_Candidate(beam, t, logprobs) for t in logprobs)
        for inst in live:
            inst.advance(candidates[id(inst)], eos_token_id)
    return instances


def _outputs(instances: list[_BeamSearchInstance], tokenizer: Any) -> list[BeamSearchOutput]:
    return [
        BeamSearchOutput([_with_text(s, inst, tokenizer) for s in inst.best_sequences()])
        for inst in instances
    ]


def beam_search(
    engine: LLMEngine, prompts: list[list[int]], params: BeamSearchParams
) -> list[BeamSearchOutput]:
    """Run beam search for every prompt (token ids) on `engine`; outputs in prompt order."""
    search = _search(prompts, params, engine.engine_config.model_config.max_model_len,
                     engine.input_processor.eos_token_id)
    step_params = _step_params(params.beam_width)
    try:
        beams = next(search)
        while True:
            beams = search.send(_run_step(engine, beams, step_params))
    except StopIteration as done:
        return _outputs(done.value, engine.get_tokenizer())


async def beam_search_async(
    engine: AsyncLLM, prompt_token_ids: list[int], params: BeamSearchParams
) -> BeamSearchOutput:
    """The same search for one prompt on the server's AsyncLLM: each step's beams run as
    concurrent requests in the engine's continuous batch (the server's use_beam_search)."""
    core = engine.engine
    search = _search([prompt_token_ids], params, engine.get_model_config().max_model_len,
                     core.input_processor.eos_token_id)
    step_params = _step_params(params.beam_width)
    try:
        beams = next(search)
        while True:
            beams = search.send(await _run_step_async(engine, beams, step_params))
    except StopIteration as done:
        return _outputs(done.value, engine.get_tokenizer())[0]


async def _run_step_async(
    engine: AsyncLLM, prompts: StepRequests, params: SamplingParams
) -> StepResults:
    """One token for every beam, concurrently; aborts them all if any fails or the caller
    is cancelled (a client that went away)."""

    async def one(request_id: str, token_ids: list[int]) -> LogprobsDict:
        final = None
        async for output in engine.generate({"prompt_token_ids": token_ids}, params,
                                            request_id):
            final = output
        if final is None or not final.outputs or not final.outputs[0].logprobs:
            raise RuntimeError(f"beam step {request_id} returned no logprobs")
        return final.outputs[0].logprobs[0]

    try:
        results = await asyncio.gather(*(one(rid, ids) for rid, ids in prompts.items()))
    except BaseException:
        await engine.abort(list(prompts))
        raise
    return dict(zip(prompts, results, strict=True))


def _run_step(
    engine: LLMEngine, prompts: StepRequests, params: SamplingParams
) -> StepResults:
    """Run one token for every beam; request id → the logprobs dict of that token."""
    added: list[str] = []
    try:
        for request_id, token_ids in prompts.items():
            engine.add_request(request_id, {"prompt_token_ids": token_ids}, params)
            added.append(request_id)
        results: dict[str, LogprobsDict] = {}
        while len(results) < len(prompts) and engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished and output.request_id in prompts:
                    logprobs = output.outputs[0].logprobs
                    assert logprobs, "a beam step returned no logprobs"
                    results[output.request_id] = logprobs[0]
    except BaseException:
        engine.abort_request(list(added))
        raise
    return results


def _with_text(
    sequence: BeamSearchSequence, inst: _BeamSearchInstance, tokenizer: Any
) -> BeamSearchSequence:
    generated = sequence.tokens[inst.num_prompt_tokens :]
    if sequence.finish_reason == "stop":
        generated = generated[:-1]  # the EOS token is not part of the text
    sequence.text = tokenizer.decode(generated, skip_special_tokens=True)
    return sequence
