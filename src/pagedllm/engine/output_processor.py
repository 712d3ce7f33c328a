"""OutputProcessor: the frontend's per-request state between core outputs and users.

For every request it detokenizes new tokens incrementally, matches stop strings (a match ends
the request here and is reported so the core aborts it), and builds RequestOutputs in the
request's output kind. A request with `n` > 1 runs in the core as `n` child requests; their
sequences are gathered back into one RequestOutput here. With `best_of` > `n` it runs as
`best_of` children and, once all are finished, only the `n` with the highest cumulative
logprob are returned (vLLM v0), re-indexed 0..n-1 best first.

Logprobs arrive as lists from the core and become `Logprob` dicts here (engine/logprobs.py):
in DELTA mode each output carries only its new positions, and the prompt logprobs come
once, with the first output.

A pooling request ends in one core output carrying its pooled values: it becomes a finished
PoolingRequestOutput at once.

Each RequestOutput also carries the request's prefix-cache hits (`num_cached_tokens`, from
the core with its first output) and a snapshot of its `RequestMetrics` (arrival from the
input processor, first scheduling from the core, token times as outputs arrive here).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from pagedllm.engine.logprobs import LogprobsBuilder, sum_scored_logprobs
from pagedllm.engine.protocol import EngineCoreOutput
from pagedllm.outputs import (
    CompletionOutput,
    LogprobsDict,
    PoolingOutput,
    PoolingRequestOutput,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
)
from pagedllm.sampling_params import RequestOutputKind, SamplingParams
from pagedllm.tokenizer.detokenizer import TextState


@dataclass
class SequenceState:
    """One sequence (one core request) of a user request."""

    core_request_id: str
    index: int
    text_state: TextState
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_sent_tokens: int = 0
    # [] when the user asked for logprobs, None otherwise.
    logprobs: list[LogprobsDict] | None = None
    # 0.0 at the start when logprobs are computed for this sequence, None otherwise.
    cumulative_logprob: float | None = None
    logprobs_builder: LogprobsBuilder | None = None

    @property
    def finished(self) -> bool:
        """True once the sequence ended."""
        return self.finish_reason is not None

    def update(self, output: EngineCoreOutput) -> bool:
        """Apply one core output; True if a stop string ended the sequence here."""
        token_ids, new_logprobs = output.new_token_ids, output.new_logprobs
        if len(token_ids) > 1 and self.text_state.has_stop_strings:
            stop_string, num_kept = self._update_text_token_by_token(output)
            token_ids = token_ids[:num_kept]
            if new_logprobs is not None:
                new_logprobs = new_logprobs.head(num_kept)
        else:
            stop_string = self.text_state.update(token_ids, output.finished)
        self.token_ids.extend(token_ids)
        if new_logprobs is not None:
            if self.cumulative_logprob is not None:
                self.cumulative_logprob += sum_scored_logprobs(new_logprobs)
            if self.logprobs is not None and self.logprobs_builder is not None:
                self.logprobs.extend(self.logprobs_builder.to_dicts(new_logprobs))
        if stop_string is not None:
            self.finish_reason, self.stop_reason = "stop", stop_string
            return not output.finished
        if output.finish_reason is not None:
            self.finish_reason = str(output.finish_reason)
            self.stop_reason = output.stop_reason
        return False

    def _update_text_token_by_token(self, output: EngineCoreOutput) -> tuple[str | None, int]:
        """Feed several tokens of one step (speculative decoding) one at a time, so that
        a stop string ends the output at the token that completed it, as one-token steps
        would. Returns (the stop string or None, how many tokens are kept)."""
        token_ids = output.new_token_ids
        for i, token_id in enumerate(token_ids):
            is_last = i == len(token_ids) - 1
            stop_string = self.text_state.update([token_id], output.finished and is_last)
            if stop_string is not None:
                return stop_string, i + 1
        return None, len(token_ids)

    def make_output(self, delta: bool, index: int | None = None) -> CompletionOutput:
        """The sequence so far (delta: only what was not sent yet), as output `index`."""
        token_start = self.num_sent_tokens if delta else 0
        output = CompletionOutput(
            index=self.index if index is None else index,
            text=self.text_state.get_output_text(delta),
            token_ids=list(self.token_ids[token_start:]),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=None if self.logprobs is None else self.logprobs[token_start:],
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
        self.num_sent_tokens = len(self.token_ids)
        return output


@dataclass
class UserRequestState:
    """A user's request: the prompt and its `n` sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    output_kind: RequestOutputKind
    sequences: list[SequenceState]
    # Sequences returned: `n` (fewer than len(sequences) when best_of > n).
    num_returned: int = 1
    prompt_logprobs: PromptLogprobs | None = None
    is_prompt_logprobs_sent: bool = False
    metrics: RequestMetrics | None = None
    num_cached_tokens: int | None = None
    kv_transfer_params: dict[str, Any] | None = None

    def observe(self, output: EngineCoreOutput, now: float) -> None:
        """Note what a core output tells about the request's timings, cache hits and KV
        transfer."""
        metrics = self.metrics
        if self.num_cached_tokens is None:
            self.num_cached_tokens = output.num_cached_tokens
        if output.kv_transfer_params is not None:
            self.kv_transfer_params = output.kv_transfer_params
        if metrics is None:
            return
        if metrics.first_scheduled_time is None and output.first_scheduled_time is not None:
            metrics.first_scheduled_time = output.first_scheduled_time
            metrics.time_in_queue = output.first_scheduled_time - metrics.arrival_time
        if output.new_token_ids:
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now

    @property
    def finished(self) -> bool:
        """True once every sequence ended."""
        return all(s.finished for s in self.sequences)

    def set_prompt_logprobs(self, prompt_logprobs: list[LogprobsDict]) -> None:
        """Store prompt logprobs: None for the first token (and any position not scored)."""
        if self.prompt_logprobs is None:
            missing = len(self.prompt_token_ids) - len(prompt_logprobs)
            self.prompt_logprobs = [None] * missing + list(prompt_logprobs)

    def make_output(self, changed: list[SequenceState]) -> RequestOutput | None:
        """The RequestOutput to emit after `changed` sequences were updated, if any."""
        finished = self.finished
        if len(self.sequences) > self.num_returned:
            # best_of: the ranking needs every sequence finished, whatever the output kind.
            if not finished:
                return None
            outputs = self._best_outputs()
        elif self.output_kind == RequestOutputKind.FINAL_ONLY:
            if not finished:
                return None
            outputs = [s.make_output(delta=False) for s in self.sequences]
        elif self.output_kind == RequestOutputKind.DELTA:
            outputs = [s.make_output(delta=True) for s in changed]
        else:
            outputs = [s.make_output(delta=False) for s in self.sequences]
        prompt_logprobs = self.prompt_logprobs
        if self.output_kind == RequestOutputKind.DELTA and self.is_prompt_logprobs_sent:
            prompt_logprobs = None
        self.is_prompt_logprobs_sent = self.is_prompt_logprobs_sent or prompt_logprobs is not None
        if finished and self.metrics is not None and self.metrics.finished_time is None:
            self.metrics.finished_time = time.time()
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=self.num_cached_tokens,
            metrics=None if self.metrics is None else dataclasses.replace(self.metrics),
            kv_transfer_params=self.kv_transfer_params if finished else None,
        )

    def _best_outputs(self) -> list[CompletionOutput]:
        """The `n` sequences with the highest cumulative logprob, best first."""
        ranked = sorted(
            self.sequences,
            key=lambda s: s.cumulative_logprob if s.cumulative_logprob is not None else -1e30,
            reverse=True,
        )
        best = ranked[: self.num_returned]
        return [s.make_output(delta=False, index=i) for i, s in enumerate(best)]


class OutputProcessor:
    """Turns EngineCoreOutputs into RequestOutputs for every live user request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.logprobs_builder = LogprobsBuilder(tokenizer)
        self.requests: dict[str, UserRequestState] = {}
        self.sequence_owner: dict[str, UserRequestState] = {}
        # Live pooling requests: id → the prompt tokens they pool.
        self.pooling_requests: dict[str, list[int]] = {}

    def is_live(self, request_id: str) -> bool:
        """True while a user request with this id is running."""
        return request_id in self.requests or request_id in self.pooling_requests

    def add_pooling_request(self, request_id: str, prompt_token_ids: list[int]) -> None:
        """Register a pooling request (it runs in the core under the same id)."""
        if self.is_live(request_id):
            raise ValueError(f"Request id {request_id!r} is already running.")
        self.pooling_requests[request_id] = prompt_token_ids

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        core_request_ids: list[str],
        arrival_time: float | None = None,
    ) -> None:
        """Register a user request whose sequences run as `core_request_ids`.

        `params` are the user's: `n` sequences are returned out of len(core_request_ids).
        `arrival_time` (time.time()) starts its RequestMetrics (none without it).
        """
        if self.is_live(request_id):
            raise ValueError(f"Request id {request_id!r} is already running.")
        num_returned = min(params.n, len(core_request_ids))
        has_logprobs = params.logprobs is not None
        # Ranking best_of sequences needs their cumulative logprob even without logprobs.
        has_cumulative = has_logprobs or len(core_request_ids) > num_returned
        sequences = [
            SequenceState(
                core_id,
                index,
                TextState(self.tokenizer, prompt_token_ids, params),
                logprobs=[] if has_logprobs else None,
                cumulative_logprob=0.0 if has_cumulative else None,
                logprobs_builder=self.logprobs_builder,
            )
            for index, core_id in enumerate(core_request_ids)
        ]
        state = UserRequestState(
            request_id, prompt, prompt_token_ids, params.output_kind, sequences, num_returned,
            metrics=None if arrival_time is None else RequestMetrics(arrival_time),
        )
        self.requests[request_id] = state
        for seq in sequences:
            self.sequence_owner[seq.core_request_id] = state

    def process_outputs(
        self, outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput | PoolingRequestOutput], list[str]]:
        """Apply one step's core outputs.

        Returns:
            the outputs to deliver, and core request ids to abort (stop strings).
        """
        changed: dict[str, list[SequenceState]] = {}
        to_abort: list[str] = []
        results: list[RequestOutput | PoolingRequestOutput] = []
        now = time.time()
        for output in outputs:
            if output.pooling_output is not None:
                pooled = self._pooling_output(output)
                if pooled is not None:
                    results.append(pooled)
                continue
            state = self.sequence_owner.get(output.request_id)
            if state is None:
                continue  # aborted by the user meanwhile
            seq = next(s for s in state.sequences if s.core_request_id == output.request_id)
            if seq.finished:
                continue
            state.observe(output, now)
            if output.new_prompt_logprobs is not None:
                state.set_prompt_logprobs(
                    self.logprobs_builder.to_dicts(output.new_prompt_logprobs)
                )
            if seq.update(output):
                to_abort.append(seq.core_request_id)
            changed.setdefault(state.request_id, []).append(seq)
        for request_id, seqs in changed.items():
            state = self.requests[request_id]
            result = state.make_output(seqs)
            if result is not None:
                results.append(result)
            if state.finished:
                self._forget(state)
        return results, to_abort

    def _pooling_output(self, output: EngineCoreOutput) -> PoolingRequestOutput | None:
        """The finished output of a pooling request (None if it was aborted meanwhile)."""
        from pagedllm.pooling.model_pooler import from_pooled_data  # torch, when pooling

        prompt_token_ids = self.pooling_requests.pop(output.request_id, None)
        if prompt_token_ids is None or output.pooling_output is None:
            return None
        data = from_pooled_data(output.pooling_output)
        return PoolingRequestOutput(output.request_id, PoolingOutput(data), prompt_token_ids)

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forget user requests; returns the core request ids to abort."""
        core_ids: list[str] = []
        for request_id in request_ids:
            if self.pooling_requests.pop(request_id, None) is not None:
                core_ids.append(request_id)
                continue
            state = self.requests.get(request_id)
            if state is not None:
                core_ids.extend(s.core_request_id for s in state.sequences if not s.finished)
                self._forget(state)
        return core_ids

    def _forget(self, state: UserRequestState) -> None:
        self.requests.pop(state.request_id, None)
        for seq in state.sequences:
            self.sequence_owner.pop(seq.core_request_id, None)

    def get_num_unfinished_requests(self) -> int:
        """User requests still live."""
        return len(self.requests) + len(self.pooling_requests)

    def has_unfinished_requests(self) -> bool:
        """True while any user request is live."""
        return bool(self.requests or self.pooling_requests)
