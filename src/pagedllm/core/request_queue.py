"""Scheduling policies: the order in which requests are admitted and preempted.

`RequestQueue` is the interface the scheduler uses for its waiting (and swapped) queues;
`FCFSRequestQueue` is first come, first served, `PriorityRequestQueue` orders by
`(priority, arrival_time)` (lower first), as vLLM's "priority" policy does. Besides
ordering a queue, a policy tells the scheduler how to order the running batch (its tail is
the preemption victim) and whether a waiting request may preempt a running one. A queue only
orders requests: it never changes their status and never touches KV blocks.
"""

from __future__ import annotations

import abc
import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from pagedllm.config import SCHEDULING_POLICIES
from pagedllm.request import Request


class RequestQueue(abc.ABC):
    """Ordered collection of waiting requests.

    `peek`/`pop` return the request to admit next. `prepend` puts a request ahead of the
    others (a preempted request must resume before newer arrivals); a policy that orders by
    something else may treat it as `add`. `peek` and `pop` raise IndexError when empty.
    """

    @abc.abstractmethod
    def add(self, request: Request) -> None:
        """Queue a new request by the policy's order."""

    @abc.abstractmethod
    def prepend(self, request: Request) -> None:
        """Queue a request to be admitted before the others (a preempted one)."""

    @abc.abstractmethod
    def peek(self) -> Request:
        """The request to admit next, left in the queue."""

    @abc.abstractmethod
    def pop(self) -> Request:
        """Remove and return the request to admit next."""

    @abc.abstractmethod
    def remove(self, request: Request) -> None:
        """Remove `request` (ValueError if it is not queued)."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """Requests in admission order."""

    def __bool__(self) -> bool:
        return len(self) > 0

    def order_running(self, running: list[Request]) -> list[Request]:
        """The running batch in scheduling order: the tail is preempted first.

        The default keeps admission order (the newest request is the victim).
        """
        return running

    def outranks(self, request: Request, other: Request) -> bool:
        """True if `request` (waiting) should preempt `other` (running) to be admitted."""
        return False


class FCFSRequestQueue(RequestQueue):
    """First come, first served: a deque in arrival order; preempted requests go first."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        """Queue at the back."""
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        """Queue at the front."""
        self._queue.appendleft(request)

    def peek(self) -> Request:
        """The front request."""
        if not self._queue:
            raise IndexError("peek from an empty request queue")
        return self._queue[0]

    def pop(self) -> Request:
        """Remove and return the front request."""
        if not self._queue:
            raise IndexError("pop from an empty request queue")
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        """Remove `request` (O(n); aborts are rare)."""
        # By identity: Request is a dataclass, and comparing by value would walk token lists.
        for index, queued in enumerate(self._queue):
            if queued is request:
                del self._queue[index]
                return
        raise ValueError(f"request {request.request_id} is not in the queue")

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


def _priority_key(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_time)


class PriorityRequestQueue(RequestQueue):
    """Lowest `(priority, arrival_time)` first: a heap, ties broken by insertion order.

    `prepend` is `add`: a preempted request keeps its priority and arrival time, which
    already put it ahead of newer requests of the same priority.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        """Queue by (priority, arrival_time)."""
        key = _priority_key(request)
        heapq.heappush(self._heap, (key[0], key[1], next(self._counter), request))

    def prepend(self, request: Request) -> None:
        """Same as `add`: the key already orders preempted requests."""
        self.add(request)

    def peek(self) -> Request:
        """The request with the lowest key."""
        if not self._heap:
            raise IndexError("peek from an empty request queue")
        return self._heap[0][3]

    def pop(self) -> Request:
        """Remove and return the request with the lowest key."""
        if not self._heap:
            raise IndexError("pop from an empty request queue")
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        """Remove `request` (O(n); aborts are rare)."""
        for index, entry in enumerate(self._heap):
            if entry[3] is request:
                self._heap[index] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return
        raise ValueError(f"request {request.request_id} is not in the queue")

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap, key=lambda e: e[:3]))

    def order_running(self, running: list[Request]) -> list[Request]:
        """By (priority, arrival_time), stable: the lowest-priority request is the tail."""
        return sorted(running, key=_priority_key)

    def outranks(self, request: Request, other: Request) -> bool:
        """True if `request` has a strictly lower (priority, arrival_time) than `other`."""
        return _priority_key(request) < _priority_key(other)


def create_request_queue(policy: str = "fcfs") -> RequestQueue:
    """Build a queue for a scheduling policy name ("fcfs" or "priority")."""
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(
        f"Unknown scheduling_policy {policy!r}; supported: {', '.join(SCHEDULING_POLICIES)}."
    )
