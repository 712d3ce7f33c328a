"""Requests whose prompt KV a KV connector loads asynchronously (vLLM's
WAITING_FOR_REMOTE_KVS), and the finished ones whose blocks wait for a peer to pull them.

A waiting request the connector has KV for, arriving asynchronously, is *parked* at
admission: it gets blocks for the tokens to load (kept out of the prefix cache until their
KV is there), holds no seat and no budget, and computes nothing, so the requests behind it
go on. When the worker reports its load done, it becomes *ready*: this queue admits it
first among the waiting ones, from its computed tokens, and the allocation that admits it
makes the loaded blocks findable. A load that failed either ends the request with an error
(`kv_load_failure_policy` "fail") or sends it on from its own cached prefix: it computes the
rest itself ("recompute"), into the blocks it already holds.

On the producing side, a finished request whose blocks a peer will pull (the connector's
`request_finished` asked to delay the free) is *held*: it is no longer a request of the
engine, but its blocks stay until the worker reports them pulled or their lease over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from pagedllm.core.admission import Candidate
from pagedllm.core.admission_queues import AdmissionQueue
from pagedllm.core.step_plan import StepPlan
from pagedllm.request import Request, RequestStatus


class RemoteKVAdmission(AdmissionQueue):
    """Parked requests (loading) and loaded ones (ready, admitted in arrival order)."""

    def __init__(self) -> None:
        super().__init__()
        self.loading: dict[str, Request] = {}
        self.ready: deque[Request] = deque()
        # Where each parked request's own KV ends (its prefix-cache hit): a failed load
        # under "recompute" goes on from there.
        self._num_local: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.ready)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.ready)

    def peek(self) -> Request:
        return self.ready[0]

    def pop(self) -> Request:
        request = self.ready.popleft()
        self._num_local.pop(request.request_id, None)
        return request

    def candidate(self, request: Request) -> Candidate:
        """From its computed tokens (loaded, or its own prefix after a failed load)."""
        return Candidate(request, request.num_computed_tokens)

    def on_admit(self, candidate: Candidate, plan: StepPlan) -> None:
        """Nothing besides running it: its blocks are held already."""

    # ------------------------------------------------------------------- parking

    def park(self, request: Request, num_local_tokens: int) -> None:
        """`request` waits for its load (its `num_computed_tokens` counts the loaded
        tokens; `num_local_tokens` of them are its own prefix-cache hit)."""
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.loading[request.request_id] = request
        self._num_local[request.request_id] = num_local_tokens

    def holds(self, request: Request) -> bool:
        """Whether `request` is parked or ready here."""
        return request.request_id in self._num_local

    def remove(self, request: Request) -> None:
        """Take `request` out (it was aborted)."""
        if self.loading.pop(request.request_id, None) is None:
            self.ready.remove(request)
        self._num_local.pop(request.request_id, None)

    def loaded(self, request_id: str) -> None:
        """Its load finished: it may run (ids of requests no longer parked are ignored)."""
        request = self.loading.pop(request_id, None)
        if request is not None:
            self.ready.append(request)

    def load_failed(self, request_id: str, retry: bool) -> Request | None:
        """Its load failed: with `retry` it goes on from its own prefix (ready again),
        else it leaves. The request, or None when it is no longer parked."""
        request = self.loading.pop(request_id, None)
        if request is None:
            return None
        if not retry:
            del self._num_local[request_id]
            return request
        request.num_computed_tokens = self._num_local[request_id]
        request.num_cached_tokens = request.num_computed_tokens  # the loaded never came
        self.ready.append(request)
        return request

    @property
    def num_loading(self) -> int:
        """Requests whose load is under way."""
        return len(self.loading)
