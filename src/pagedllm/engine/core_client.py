"""EngineCoreClient: how the frontend talks to the engine core.

One interface, several transports: in-process today (`InprocClient`, used by the offline
`LLM`); multi-process clients over ZMQ implement the same methods later.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from pagedllm.config import EngineConfig
from pagedllm.engine.core import EngineCore
from pagedllm.engine.protocol import EngineCoreOutputs, EngineCoreRequest


class EngineCoreClient(ABC):
    """Frontend-side handle on an engine core."""

    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None:
        """Send a request to the core."""

    @abstractmethod
    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests in the core."""

    @abstractmethod
    def get_output(self) -> EngineCoreOutputs:
        """Outputs of the next step (runs it, in-process)."""

    def shutdown(self) -> None:  # noqa: B027 - an optional hook: most transports hold nothing
        """Stop the core."""


class InprocClient(EngineCoreClient):
    """The core in this process: `get_output` runs one `step()` directly."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.engine_core = EngineCore(engine_config)

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue the request in the core's scheduler."""
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort in the core and free blocks at once."""
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def get_output(self) -> EngineCoreOutputs:
        """Run one step."""
        return self.engine_core.step()

    def shutdown(self) -> None:
        """Release the core's executor."""
        self.engine_core.shutdown()


class AsyncEngineCoreClient(EngineCoreClient):
    """A core that runs beside the caller's event loop (a thread today, a process later).

    Contract: `add_request` and `abort_requests` only enqueue and return at once (safe to call
    from the event loop); outputs of every step are awaited with `get_output_async`, in step
    order. When the core dies, `get_output_async` and `check_health` raise `EngineDeadError`.
    """

    def get_output(self) -> EngineCoreOutputs:
        """Not available: the core steps on its own; await `get_output_async` instead."""
        raise NotImplementedError("An async core client delivers outputs via get_output_async.")

    @abstractmethod
    async def get_output_async(self) -> EngineCoreOutputs:
        """The next step's outputs (waits while the core is idle)."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise EngineDeadError if the core is no longer running."""
