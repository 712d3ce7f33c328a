"""OutputProcessor: the frontend's per-request state between core outputs and users.

For every request it detokenizes new tokens incrementally, matches stop strings (a match ends
the request here and is reported so the core aborts it), and builds RequestOutputs in the
request's output kind. A request with `n` > 1 runs in the core as `n` child requests; their
sequences are gathered back into one RequestOutput here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedllm.engine.protocol import EngineCoreOutput
from pagedllm.outputs import CompletionOutput, RequestOutput
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

    @property
    def finished(self) -> bool:
        """True once the sequence ended."""
        return self.finish_reason is not None

    def update(self, output: EngineCoreOutput) -> bool:
        """Apply one core output; True if a stop string ended the sequence here."""
        self.token_ids.extend(output.new_token_ids)
        stop_string = self.text_state.update(output.new_token_ids, output.finished)
        if stop_string is not None:
            self.finish_reason, self.stop_reason = "stop", stop_string
            return not output.finished
        if output.finish_reason is not None:
            self.finish_reason = str(output.finish_reason)
            self.stop_reason = output.stop_reason
        return False

    def make_output(self, delta: bool) -> CompletionOutput:
        """The sequence so far (delta: only what was not sent yet)."""
        token_start = self.num_sent_tokens if delta else 0
        output = CompletionOutput(
            index=self.index,
            text=self.text_state.get_output_text(delta),
            token_ids=list(self.token_ids[token_start:]),
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

    @property
    def finished(self) -> bool:
        """True once every sequence ended."""
        return all(s.finished for s in self.sequences)

    def make_output(self, changed: list[SequenceState]) -> RequestOutput | None:
        """The RequestOutput to emit after `changed` sequences were updated, if any."""
        finished = self.finished
        if self.output_kind == RequestOutputKind.FINAL_ONLY:
            if not finished:
                return None
            outputs = [s.make_output(delta=False) for s in self.sequences]
        elif self.output_kind == RequestOutputKind.DELTA:
            outputs = [s.make_output(delta=True) for s in changed]
        else:
            outputs = [s.make_output(delta=False) for s in self.sequences]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=finished,
        )


class OutputProcessor:
    """Turns EngineCoreOutputs into RequestOutputs for every live user request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, UserRequestState] = {}
        self.sequence_owner: dict[str, UserRequestState] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        core_request_ids: list[str],
    ) -> None:
        """Register a user request whose sequences run as `core_request_ids`."""
        if request_id in self.requests:
            raise ValueError(f"Request id {request_id!r} is already running.")
        sequences = [
            SequenceState(core_id, index, TextState(self.tokenizer, prompt_token_ids, params))
            for index, core_id in enumerate(core_request_ids)
        ]
        state = UserRequestState(
            request_id, prompt, prompt_token_ids, params.output_kind, sequences
        )
        self.requests[request_id] = state
        for seq in sequences:
            self.sequence_owner[seq.core_request_id] = state

    def process_outputs(
        self, outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's core outputs.

        Returns:
            the RequestOutputs to deliver, and core request ids to abort (stop strings).
        """
        changed: dict[str, list[SequenceState]] = {}
        to_abort: list[str] = []
        for output in outputs:
            state = self.sequence_owner.get(output.request_id)
            if state is None:
                continue  # aborted by the user meanwhile
            seq = next(s for s in state.sequences if s.core_request_id == output.request_id)
            if seq.finished:
                continue
            if seq.update(output):
                to_abort.append(seq.core_request_id)
            changed.setdefault(state.request_id, []).append(seq)
        results = []
        for request_id, seqs in changed.items():
            state = self.requests[request_id]
            result = state.make_output(seqs)
            if result is not None:
                results.append(result)
            if state.finished:
                self._forget(state)
        return results, to_abort

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forget user requests; returns the core request ids to abort."""
        core_ids = []
        for request_id in request_ids:
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
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        """True while any user request is live."""
        return bool(self.requests)
