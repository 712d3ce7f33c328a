"""What a request carries, and the engine core's view of one sequence (token ids only).

`RequestData` holds the per-request fields that travel from the API to the model runner
unchanged, defined once: the frontend fills it, the wire (engine/protocol.py) carries it,
and the scheduler's `Request`, the worker's `NewRequestData` and its request state hold it
by reference. A new per-request field is added to `RequestData` and read by its consumers;
nothing between them copies fields by hand.

The scheduler owns Request objects; nothing outside `core/` and `engine/core.py` mutates them.
`RequestStatus` is ordered so that every finished state compares greater than PREEMPTED.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pagedllm.lora.request import LoRARequest
from pagedllm.multimodal.inputs import MultiModalFeature
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams


class RequestData(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The fields a request carries from the API to the model runner.

    Attributes:
        prompt_token_ids: the prompt.
        sampling_params: how to sample; `max_tokens` is resolved by the input processor.
        eos_token_id: the model's end-of-sequence id (masked until `min_tokens`), or None.
        pooling_params: set for a pooling request (an embedding, class scores...): it is
            computed whole in one step and finishes with its pooled output; its
            `sampling_params` are then never used.
        token_type_ids: per prompt token, 0 or 1 (the second text of a cross-encoder pair).
        lora_request: its LoRA adapter, or None for the base model.
        mm_features: its images / videos, processed (multimodal/inputs.py), in prompt
            order; None for a text prompt.
        cache_salt: vLLM's cache_salt: only requests with the same salt share prefix-cache
            blocks (a tenant's prompts stay unreadable by timing to another); None: none.
    """

    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    pooling_params: PoolingParams | None = None
    token_type_ids: list[int] | None = None
    lora_request: LoRARequest | None = None
    mm_features: list[MultiModalFeature] | None = None
    cache_salt: str | None = None


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
    # Admitted with blocks while a KV connector loads its prompt's KV from elsewhere
    # (vLLM's WAITING_FOR_REMOTE_KVS): it holds no seat and computes nothing until loaded.
    WAITING_FOR_REMOTE_KVS = enum.auto()
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


class CarriesRequestData:
    """Read access to the `RequestData` a holder carries (the scheduler's `Request`, the
    worker's request state): its fields as attributes, defined here once."""

    __slots__ = ()
    data: RequestData

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt."""
        return self.data.prompt_token_ids

    @property
    def sampling_params(self) -> SamplingParams:
        """How to sample (`max_tokens` resolved)."""
        return self.data.sampling_params

    @property
    def eos_token_id(self) -> int | None:
        """The model's end-of-sequence id, or None."""
        return self.data.eos_token_id

    @property
    def pooling_params(self) -> PoolingParams | None:
        """Set for a pooling request."""
        return self.data.pooling_params

    @property
    def token_type_ids(self) -> list[int] | None:
        """Its token types, when the model takes them."""
        return self.data.token_type_ids

    @property
    def lora_request(self) -> LoRARequest | None:
        """Its LoRA adapter, or None."""
        return self.data.lora_request

    @property
    def mm_features(self) -> list[MultiModalFeature]:
        """Its images / videos in prompt order (empty for a text prompt)."""
        return self.data.mm_features or []

    @property
    def cache_salt(self) -> str | None:
        """Its prefix-cache salt, or None."""
        return self.data.cache_salt


@dataclass(slots=True)
class Request(CarriesRequestData):
    """One sequence in the engine core.

    Attributes:
        request_id: unique id.
        data: what it carries from the API (prompt, sampling parameters, ...; read as
            attributes through CarriesRequestData).
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
        spec_token_ids: draft tokens proposed for its next step (speculative decoding);
            they are verified, never appended as such.
        kv_transfer_params: what its KV connector reports when it finishes (vLLM's
            `kv_transfer_params` of the response), or None.
    """

    request_id: str
    data: RequestData
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
    spec_token_ids: list[int] = field(default_factory=list)
    kv_transfer_params: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.data.prompt_token_ids)

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
