"""The queues the scheduler admits from, behind one interface: waiting requests (new, or
preempted by recompute), swapped-out requests, and pooling requests.

Each queue says where a request of its own starts (a prefix-cache lookup, its computed
tokens, nothing), which order rules of its own apply before the scheduler's checks
(admission.py), whether an admitted request takes a seat in the running batch, and what
admitting it does besides (a swap-in's copy list, a first admission's prefix hits). The
scheduler's one loop (`Scheduler._admit`) does the rest the same way for all of them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pagedllm.core.admission import AdmissionCheck, Candidate, Verdict
from pagedllm.core.kv_cache_manager import KVCacheManager
from pagedllm.core.request_queue import RequestQueue
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.core.step_plan import StepPlan
from pagedllm.core.swap_manager import SwapManager
from pagedllm.request import Request, RequestStatus


class AdmissionQueue(ABC):
    """Requests waiting to join a step, in admission order.

    Attributes:
        takes_seat: an admitted request joins the running batch (bounded by max_num_seqs).
        passes_over: a request that SKIPs keeps its place while later ones go first (else a
            SKIP stops admission from this queue).
        checks: this queue's order rules, asked before the scheduler's checks.
    """

    takes_seat = True
    passes_over = False

    def __init__(self) -> None:
        self.checks: list[AdmissionCheck] = []

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """Requests in admission order."""

    def __bool__(self) -> bool:
        return len(self) > 0

    @abstractmethod
    def peek(self) -> Request:
        """The request to admit next."""

    @abstractmethod
    def pop(self) -> Request:
        """Remove and return the request to admit next."""

    def put_back(self, requests: list[Request]) -> None:
        """Requests passed over this step, in their order, back at the front."""
        raise NotImplementedError(f"{type(self).__name__} does not pass requests over")

    @abstractmethod
    def candidate(self, request: Request) -> Candidate:
        """Where `request` starts if admitted now."""

    @abstractmethod
    def on_admit(self, candidate: Candidate, plan: StepPlan) -> None:
        """What admitting the request does besides running it."""


class _Outranked(AdmissionCheck):
    """Another queue's head goes first: `first(own head, other head)` says whether ours may."""

    def __init__(
        self, other: RequestQueue, goes_first: Callable[[Request, Request], bool]
    ) -> None:
        self.other = other
        self.goes_first = goes_first

    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """STOP while the other queue's head goes first."""
        if self.other and not self.goes_first(candidate.request, self.other.peek()):
            return Verdict.STOP
        return Verdict.ADMIT


class _OverRequestQueue(AdmissionQueue):
    """An admission queue over one of the scheduler's `RequestQueue`s (its policy's order)."""

    def __init__(self, queue: RequestQueue, manager: KVCacheManager) -> None:
        super().__init__()
        self.queue = queue
        self.manager = manager

    def __len__(self) -> int:
        return len(self.queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.queue)

    def peek(self) -> Request:
        return self.queue.peek()

    def pop(self) -> Request:
        return self.queue.pop()


class WaitingAdmission(_OverRequestQueue):
    """New requests and those preempted by recompute, from their longest cached prefix.
    Swapped-out requests resume first unless the policy ranks a waiting one higher; a
    request whose grammar still compiles is passed over, keeping its place."""

    passes_over = True

    def __init__(self, queue: RequestQueue, swapped: RequestQueue, manager: KVCacheManager):
        super().__init__(queue, manager)
        self.checks = [_Outranked(swapped, queue.outranks)]
        # The engine's KV connector (distributed/kv_transfer/), or None.
        self.kv_connector: Any = None

    def put_back(self, requests: list[Request]) -> None:
        for request in reversed(requests):
            self.queue.prepend(request)

    def candidate(self, request: Request) -> Candidate:
        """From its prefix-cache hit, and what a KV connector has after it."""
        computed_blocks, num_cached = self.manager.get_computed_blocks(request)
        num_external, is_async = 0, False
        # Prompt logprobs need every prompt position computed: nothing is loaded for them.
        if self.kv_connector is not None and not (
                request.sampling_params.skip_reading_prefix_cache):
            self.manager.block_hashes(request)  # the connector names blocks by them
            num_external, is_async = self.kv_connector.get_num_new_matched_tokens(
                request, num_cached)
        return Candidate(request, num_cached + num_external, computed_blocks,
                         num_external_tokens=num_external,
                         load_is_async=bool(is_async and num_external))

    def on_admit(self, candidate: Candidate, plan: StepPlan) -> None:
        """Its cached tokens count as computed; a first admission records its hits; a KV
        connector's tokens are to be loaded into the blocks just allocated."""
        request = candidate.request
        request.num_computed_tokens = candidate.num_computed_tokens
        if request.num_cached_tokens is None:
            request.num_cached_tokens = candidate.num_computed_tokens
            request.first_scheduled_time = time.time()
        if candidate.num_external_tokens:  # the connector loads them into the new blocks
            self.kv_connector.update_state_after_alloc(
                request, self.manager.get_block_ids(request.request_id)[0],
                candidate.num_external_tokens)


class SwappedAdmission(_OverRequestQueue):
    """Requests preempted by swap: back in from their computed tokens, their host blocks
    copied in before the step; a waiting request the policy ranks higher goes first."""

    def __init__(
        self, queue: RequestQueue, waiting: RequestQueue, manager: KVCacheManager,
        swap_manager: SwapManager,
    ) -> None:
        super().__init__(queue, manager)
        self.swap_manager = swap_manager
        self.checks = [_Outranked(waiting, lambda ours, theirs: not waiting.outranks(theirs, ours))]

    def candidate(self, request: Request) -> Candidate:
        """From its computed tokens (their KV comes back from the host)."""
        return Candidate(request, request.num_computed_tokens)

    def on_admit(self, candidate: Candidate, plan: StepPlan) -> None:
        """The host → device copies of its blocks, before this step's forward."""
        request_id = candidate.request.request_id
        block_ids = self.manager.get_block_ids(request_id)
        plan.blocks_to_swap_in.extend(self.swap_manager.swap_in(request_id, block_ids))


class PoolingQueue(AdmissionQueue):
    """Pooling requests (embeddings, class scores): each computes its whole prompt in one
    step and ends with it, so it holds no seat (`max_num_seqs` bounds the generating batch)
    and leaves one budget token for every running request; it never reads the prefix
    cache (pooling needs every position's state). The queue also holds the requests
    admitted this step until their outputs come back."""

    takes_seat = False

    def __init__(self, num_running: Callable[[], int]) -> None:
        super().__init__()
        self.waiting: deque[Request] = deque()
        self.in_step: list[Request] = []
        self.num_running = num_running

    def __len__(self) -> int:
        return len(self.waiting)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.waiting)

    def add(self, request: Request) -> None:
        """Queue a pooling request (arrival order)."""
        self.waiting.append(request)

    def peek(self) -> Request:
        return self.waiting[0]

    def pop(self) -> Request:
        return self.waiting.popleft()

    def remove(self, request: Request) -> None:
        """Take a request out, waiting or admitted this step."""
        if any(r is request for r in self.in_step):  # by identity: Requests compare by value
            self.in_step = [r for r in self.in_step if r is not request]
        else:
            self.waiting.remove(request)

    def candidate(self, request: Request) -> Candidate:
        """Its whole prompt, from nothing cached, one budget token left per running one."""
        return Candidate(request, 0, whole=True, reserve=self.num_running())

    def on_admit(self, candidate: Candidate, plan: StepPlan) -> None:
        """Held until its pooled output comes back."""
        request = candidate.request
        request.num_cached_tokens, request.first_scheduled_time = 0, time.time()
        self.in_step.append(request)

    def finish_step(
        self, scheduler_output: SchedulerOutput, pooler_output: Mapping[str, object]
    ) -> list[Request]:
        """The requests of the step that got their pooled outputs: finished, out of the
        queue (the caller frees their blocks)."""
        finished = []
        for request in self.in_step:
            if request.request_id not in scheduler_output.num_scheduled_tokens:
                continue  # scheduled by a later schedule() (not possible in one step)
            assert request.request_id in pooler_output, (
                f"pooling request {request.request_id} got no pooled output"
            )
            request.status = RequestStatus.FINISHED_STOPPED
            finished.append(request)
        self.in_step = [r for r in self.in_step if not r.is_finished()]
        return finished
