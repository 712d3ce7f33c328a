"""Publishing KV cache events over ZMQ, framed as vLLM's publisher frames them, so a
prefix-aware router subscribed to a vLLM engine reads pagedllm's unchanged.

Each batch is one multipart message `[topic, seq, payload]`: `seq` counts batches from 0 as
8 big-endian bytes, `payload` is the msgpack of a `KVEventBatch` (core/kv_events.py). A
sending thread owns the PUB socket, so the engine step never waits on the network; a full
queue drops batches (logged). With a replay endpoint, a ROUTER socket answers a REQ asking
"from sequence N" (8 bytes) with every buffered batch from N on, one `[seq, payload]` each,
then `[-1 as 8 signed bytes, b""]`.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from pagedllm.config import KVEventsConfig
from pagedllm.core.kv_events import KVEventBatch
from pagedllm.logger import init_logger

logger = init_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_POLL_MS = 100


def _binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard address or a local transport binds; anything else connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """Sends event batches from a thread (see the module docstring).

    Args:
        config: the engine's kv_events_config (endpoints, buffer sizes, topic, rank).
    """

    def __init__(self, config: KVEventsConfig) -> None:
        self.config = config
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(config.max_queue_size)
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = itertools.count()
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        (self._pub.bind if _binds(config.endpoint) else self._pub.connect)(config.endpoint)
        self._replay: Any = None
        if config.replay_endpoint is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.bind(config.replay_endpoint)
        self._thread = threading.Thread(target=self._run, name="pagedllm-kv-events",
                                        daemon=True)
        self._thread.start()

    def publish(self, events: list[Any]) -> None:
        """Queue one step's events as a batch (dropped, with a warning, when full)."""
        batch = KVEventBatch(ts=time.time(), events=events,
                             data_parallel_rank=self.config.data_parallel_rank)
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            logger.warning("KV events queue full (%d batches): a batch was dropped.",
                           self.config.max_queue_size)

    def shutdown(self) -> None:
        """Send what is queued, stop the thread, close the sockets."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=5)
        self._thread.join(timeout=5)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._context.term()

    def _run(self) -> None:
        topic = self.config.topic.encode()
        while True:
            self._answer_replays()
            try:
                batch = self._queue.get(timeout=_POLL_MS / 1000)
            except queue.Empty:
                continue
            if batch is None:
                return
            seq = next(self._seq)
            payload = self._encoder.encode(batch)
            seq_bytes = seq.to_bytes(8, "big")
            self._pub.send_multipart((topic, seq_bytes, payload))
            self._buffer.append((seq, payload))

    def _answer_replays(self) -> None:
        """Answer every waiting replay request (REQ envelope: identity, b"", start seq)."""
        replay = self._replay
        while replay is not None and replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("A KV events replay request of %d frames was ignored (REQ "
                               "sends the 8-byte start sequence).", len(frames))
                continue
            identity, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    replay.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
            replay.send_multipart((identity, b"", END_SEQ, b""))
