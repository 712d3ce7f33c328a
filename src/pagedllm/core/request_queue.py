"""Waiting-queue policies: the order in which waiting requests are admitted.

`RequestQueue` is the interface the scheduler uses; `FCFSRequestQueue` is first come, first
served. A priority policy plugs in later behind the same interface. A queue only orders
requests: it never changes their status and never touches KV blocks.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Iterator

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


def create_request_queue(policy: str = "fcfs") -> RequestQueue:
    """Build the waiting queue for a scheduling policy name."""
    if policy == "fcfs":
        return FCFSRequestQueue()
    raise ValueError(f"Unknown scheduling policy {policy!r}; supported: 'fcfs'.")
