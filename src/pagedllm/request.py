"""Request: the engine core's view of one sequence (token ids only, no text).

The scheduler owns Request objects; nothing outside `core/` and `engine/core.py` mutates them.
`RequestStatus` is ordered so that every finished state compares greater than PREEMPTED.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    """Why a request ended, as the OpenAI API names it (`str(reason)`)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    # The engine could not continue the request (its forward gave non-finite logits).
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request in the engine core."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    # Preempted with its KV copied to the host pool (swap mode); resumes without recompute.
    SWAPPED = enum.auto()
    # Preempted by recompute: waits again with num_computed_tokens reset.
    PREEMPTED = enum.auto()
    # Finished states come after PREEMPTED.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        """True for every finished state."""
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        """The finish reason of a finished status, None otherwise."""
        return _FINISHED_REASONS.get(status)


_FINISHED_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass(slots=True)
class Request:
    """One sequence in the engine core.

    Attributes:
        request_id: unique id.
        prompt_token_ids: the prompt.
        sampling_params: how to sample; `max_tokens` is already resolved (never None).
        eos_token_id: the model's end-of-sequence id, or None.
        arrival_time: when the frontend received it (seconds since the epoch).
        output_token_ids: tokens generated so far.
        num_computed_tokens: tokens whose KV is in the cache.
        status: lifecycle state.
        stop_reason: the stop token id that ended it, if any.
        num_preemptions: how often it was preempted.
        priority: scheduling priority under the "priority" policy (lower runs first).
        num_cached_tokens: prefix-cache hits (in tokens) at its first admission.
        first_scheduled_time: wall-clock time (time.time()) of its first admission.
        block_hashes: chained hashes of its full blocks, in order (see core/block_hash.py).
        structured_output: its grammar when `sampling_params.structured_outputs` is set.
        pooling_params: set for a pooling request (an embedding, class scores...): it is
            computed whole in one step and finishes with its pooled output; its
            `sampling_params` are then never used.
        token_type_ids: per prompt token, 0 or 1 (the second text of a cross-encoder pair).
        spec_token_ids: draft tokens proposed for its next step (speculative decoding);
            they are verified, never appended as such.
        lora_request: its LoRA adapter (lora/request.py LoRARequest), or None.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float = field(default_factory=time.time)
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    priority: int = 0
    num_cached_tokens: int | None = None
    first_scheduled_time: float | None = None
    block_hashes: list[bytes] = field(default_factory=list)
    # Its grammar (structured_output.RequestGrammar) when it has a constraint: compiled in
    # the background, then its matcher, advanced by the scheduler with every token.
    structured_output: Any = None
    pooling_params: PoolingParams | None = None
    token_type_ids: list[int] | None = None
    spec_token_ids: list[int] = field(default_factory=list)
    lora_request: Any = None

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def is_pooling(self) -> bool:
        """True for a pooling request (no tokens are sampled)."""
        return self.pooling_params is not None

    @property
    def num_prompt_tokens(self) -> int:
        """Token count of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Token count of the output."""
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + output tokens."""
        return len(self.all_token_ids)

    @property
    def max_tokens(self) -> int:
        """Most output tokens this request may produce."""
        max_tokens = self.sampling_params.max_tokens
        assert max_tokens is not None, "max_tokens is resolved by the input processor"
        return max_tokens

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        """Record newly sampled tokens."""
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def is_finished(self) -> bool:
        """True once the request reached a finished state."""
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        """The finish reason, None while unfinished."""
        return RequestStatus.get_finished_reason(self.status)
