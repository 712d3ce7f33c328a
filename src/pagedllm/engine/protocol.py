"""Wire types between the frontend and the engine core, declared once as msgspec Structs.

They are the only objects that cross the frontend/core boundary: passed as objects
in-process, encoded with msgpack (`serial.py`) over ZMQ when the core runs in its own process
(`core_proc.py`). Frontend → core: a one-byte EngineCoreRequestType, then an EngineCoreRequest
(ADD), a list of request ids (ABORT) or a UtilityRequest (UTILITY). Core → frontend:
EngineCoreOutputs, one message per step.
"""

from __future__ import annotations

import enum
import time
from typing import Any

import msgspec

from pagedllm.metrics.stats import SchedulerStats
from pagedllm.pooling.data import PooledData
from pagedllm.request import FinishReason, RequestData
from pagedllm.worker.outputs import LogprobsLists


class EngineCoreRequestType(enum.Enum):
    """Message kinds the core accepts (one byte on the wire)."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x02"


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A tokenized request for the core: its id, what it carries to the model runner
    (request.py RequestData; `sampling_params.max_tokens` resolved), and how the scheduler
    orders it."""

    request_id: str
    data: RequestData
    arrival_time: float = msgspec.field(default_factory=time.time)
    # Scheduling priority under the "priority" policy (lower runs first).
    priority: int = 0


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New tokens of one request in one step; `finish_reason` set when it ended.

    `new_logprobs` has one position per new token (when the request asked for logprobs);
    `new_prompt_logprobs` comes once, with the first token, for prompt tokens 2..P.
    A pooling request ends in one output with `pooling_output` and no tokens.
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    pooling_output: PooledData | None = None
    # With a request's first output only: its prefix-cache hits and first admission time.
    num_cached_tokens: int | None = None
    first_scheduled_time: float | None = None
    # With a finished request's output: what its KV connector reports (vLLM's).
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """True when the request ended this step."""
        return self.finish_reason is not None


class UtilityRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A call of an EngineCore method by name (e.g. `reset_prefix_cache`), answered once."""

    call_id: int
    method: str
    args: list[Any] = []


class UtilityResult(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The answer to the UtilityRequest with `call_id`: its result, or the error's text
    (`error_type`: "ValueError" for bad input, which the caller raises as ValueError)."""

    call_id: int
    result: Any = None
    error: str | None = None
    error_type: str | None = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Everything one core step produced (or one utility call's answer)."""

    outputs: list[EngineCoreOutput] = []
    timestamp: float = msgspec.field(default_factory=time.monotonic)
    # The scheduler's state after the step (None when the core did not step).
    scheduler_stats: SchedulerStats | None = None
    utility_result: UtilityResult | None = None
    # Why the core is about to die (its last message): e.g. which worker rank failed.
    engine_error: str | None = None


class EngineCoreReady(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The core process's handshake: it started (facts the frontend needs), or why not."""

    num_gpu_blocks: int = 0
    max_model_len: int = 0
    error: str | None = None
