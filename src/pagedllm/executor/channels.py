"""The executor's two ZMQ channels to its workers.

- Broadcast (XPUB → SUB): each message (a step's SchedulerOutput, a method call, shutdown)
  is pickled once and published once; ZMQ hands the same bytes to every worker, on this
  node over `ipc://` or to other nodes over `tcp://`. The executor waits until every worker
  has subscribed before the first message, so none is lost to a late joiner.
- Responses (PUSH → PULL): workers answer `(rank, kind, payload)`; for a step only the
  driver rank answers (its ModelRunnerOutput), for a method call every rank does, and a
  rank that fails says so before it exits.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import zmq

# Response kinds.
OUTPUT, RESULT, ERROR, FATAL = "output", "result", "error", "fatal"
# Broadcast kinds.
EXECUTE, RPC, SHUTDOWN = "execute", "rpc", "shutdown"


@dataclass
class Response:
    """One worker's answer."""

    rank: int
    kind: str
    payload: Any


class ExecutorChannels:
    """The executor's side: publish to all workers, collect their responses."""

    def __init__(self, broadcast_addr: str, response_addr: str) -> None:
        self._ctx = zmq.Context()
        self._publisher = self._ctx.socket(zmq.XPUB)
        self._publisher.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscription
        self._publisher.setsockopt(zmq.SNDHWM, 0)  # never drop a step
        self.broadcast_addr = _bind(self._publisher, broadcast_addr)
        self._responses = self._ctx.socket(zmq.PULL)
        self.response_addr = _bind(self._responses, response_addr)
        self._num_subscribed = 0

    def wait_subscribed(self, num_workers: int, timeout_ms: int) -> bool:
        """True once `num_workers` workers subscribed (False after `timeout_ms`)."""
        while self._num_subscribed < num_workers:
            if not self._publisher.poll(timeout_ms):
                return False
            if self._publisher.recv()[:1] == b"\x01":
                self._num_subscribed += 1
        return True

    def publish(self, *message: Any) -> None:
        """Send one message to every worker (pickled once)."""
        self._publisher.send(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def receive(self, timeout_ms: int) -> Response | None:
        """The next worker response, or None after `timeout_ms` without one."""
        if not self._responses.poll(timeout_ms):
            return None
        return Response(*pickle.loads(self._responses.recv()))

    def close(self) -> None:
        """Close both sockets."""
        self._ctx.destroy(linger=0)


def _bind(socket: zmq.Socket[Any], addr: str) -> str:
    """Bind `addr` ("tcp://HOST:0" picks a free port); the address workers connect to."""
    if addr.startswith("tcp://") and addr.endswith(":0"):
        host = addr[len("tcp://") : -len(":0")]
        port = socket.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{port}"
    socket.bind(addr)
    return addr


class WorkerChannels:
    """A worker's side: receive what the executor publishes, answer it."""

    def __init__(self, rank: int, broadcast_addr: str, response_addr: str) -> None:
        self.rank = rank
        self._ctx = zmq.Context()
        self._subscriber = self._ctx.socket(zmq.SUB)
        self._subscriber.setsockopt(zmq.RCVHWM, 0)
        self._subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        self._subscriber.connect(broadcast_addr)
        self._responses = self._ctx.socket(zmq.PUSH)
        self._responses.connect(response_addr)

    def receive(self) -> tuple[Any, ...]:
        """The next published message (blocks)."""
        return tuple(pickle.loads(self._subscriber.recv()))

    def respond(self, kind: str, payload: Any) -> None:
        """Answer the executor."""
        self._responses.send(
            pickle.dumps((self.rank, kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        )

    def close(self) -> None:
        """Close both sockets (a pending answer is sent first, for up to a second)."""
        self._ctx.destroy(linger=1000)
