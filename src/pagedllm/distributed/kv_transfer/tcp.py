"""TcpConnector: a prefill instance's KV blocks pulled over the network by a decode
instance, in vLLM's pull style (as its NixlConnector; the name `NixlConnector` maps here).

Producer (`kv_producer` / `kv_both`): a request carrying `kv_transfer_params:
{"do_remote_decode": true}` runs its prompt as usual; when it finishes by length (the proxy
asks for one token) its blocks are *held* (`request_finished` delays their free) and its
response carries the `kv_transfer_params` a consumer needs: `do_remote_prefill`,
`remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port`, `remote_request_id`,
`remote_block_size`. The worker serves pulls on a ZMQ ROUTER socket at `kv_ip:kv_port`
from a thread of its own: a pull names the request and the blocks it wants; the answer is
one frame per layer, the blocks as the cache holds them. Once pulled, or once their lease
ends (`kv_connector_extra_config.lease_s`, default 30 s, counted from when the engine
learns the request finished), the blocks are reported sent and freed.

Consumer (`kv_consumer` / `kv_both`): a request carrying those params has every prompt
token but the last (whose logits it computes) provided asynchronously, after what its own
prefix cache holds. It waits parked (core/remote_kv.py), holding blocks, while a pool of
threads pulls the blocks it lacks (`pull_timeout_s`, default 10 s); requests behind it run
meanwhile. Blocks are written into the cache by the step thread, after a step, never
during one; a peer whose KV cache dtype differs (int8 ↔ bfloat16 / float32) is converted
row by row (the worker's converter). A pull that fails (the producer gone, the lease over,
a dropped connection, a timeout) fails the request or has it compute its prompt itself, as
`kv_load_failure_policy` says.

Tensor parallelism: a consumer of several ranks (TP=2 fed by a TP=1 producer) pulls on every
rank the KV heads that rank holds (the producer cuts them: `kv_head_range`); a load counts
as done, or failed, once every rank agrees (one small all-gather a step while loads are
under way), and the producer lets the blocks go once every rank pulled. With
`shared_memory: true` a producer on this host (a loopback address) answers with a file in
/dev/shm instead of TCP frames; the reader removes it (off by default: slower here).
Not built: a producer of several ranks, and per-layer overlap with the forward (a pull
overlaps other requests' steps instead).
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time
import uuid
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from pagedllm.distributed import parallel_state
from pagedllm.distributed.kv_transfer.base import (
    KVConnectorBase,
    KVConnectorRole,
    ScheduledKV,
    transfer_params,
)
from pagedllm.distributed.kv_transfer.config import KVTransferConfig
from pagedllm.distributed.sharding import kv_head_range
from pagedllm.logger import init_logger
from pagedllm.metrics.stats import KVTransferCounts
from pagedllm.request import RequestStatus

logger = init_logger(__name__)

DEFAULT_LEASE_S = 30.0
DEFAULT_PULL_TIMEOUT_S = 10.0
_RETRY_S = 0.005  # between asks while the producer's step has not finished the prompt
_PENDING, _DONE, _FAILED = 0, 1, 2  # a load's state on one rank
_SHM_DIR = "/dev/shm"  # where blocks for a peer on this host are handed over
_SHM_KEEP_S = 60.0  # a handed-over file its reader has not removed goes after this


@dataclass
class RemoteRequest:
    """A request held by a producer: where it serves, and its id there. A consumer pulls
    its blocks, or releases them unpulled (its own prefix cache had the prompt, the request
    ended first, its blocks do not fit ours)."""

    host: str
    port: int
    request_id: str

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> RemoteRequest:
        """From a consumer request's kv_transfer_params."""
        return cls(str(params.get("remote_host", "127.0.0.1")),
                   int(params.get("remote_port", 0)), str(params.get("remote_request_id", "")))


@dataclass
class BlockPull:
    """A consumer's load: the producer's blocks into this cache's blocks (same order)."""

    request_id: str
    local_block_ids: list[int]
    remote_block_ids: list[int]
    remote: RemoteRequest
    deadline: float = 0.0  # monotonic; set when the worker starts it


@dataclass
class BlockSend:
    """A producer's request whose blocks a peer may pull (its table this step)."""

    request_id: str
    block_ids: list[int]
    prompt_done: bool  # its prompt's KV is all computed once this step ran


@dataclass
class TcpTransfers:
    """A step's plan for the worker: pulls to start, sends to register, requests now held
    (their lease starts) and requests that finished without being held."""

    pulls: list[BlockPull] = field(default_factory=list)
    sends: list[BlockSend] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    releases: list[RemoteRequest] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.pulls or self.sends or self.held or self.dropped or self.releases)


@dataclass
class _Sendable:
    block_ids: list[int]
    ready: bool = False
    deadline: float | None = None  # set once held
    reading: int = 0  # pulls copying it now: the lease cannot end meanwhile
    served: set[int] = field(default_factory=set)  # the consumer's ranks served


class TcpConnector(KVConnectorBase):
    """Blocks pulled from a peer over TCP (see the module docstring)."""

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int,
                 bytes_per_block: int = 0) -> None:
        super().__init__(config, role, block_size, bytes_per_block)
        extra = config.kv_connector_extra_config
        self.engine_id = config.engine_id or f"pagedllm-{uuid.uuid4().hex[:12]}"
        self.advertised_host = str(extra.get("advertised_host", config.kv_ip))
        self.lease_s = float(extra.get("lease_s", DEFAULT_LEASE_S))
        self.pull_timeout_s = float(extra.get("pull_timeout_s", DEFAULT_PULL_TIMEOUT_S))
        # A producer on this host hands the blocks over in shared memory (a file in
        # /dev/shm) instead of TCP frames. Off unless asked: measured slower than loopback
        # TCP here (a 2k-token prompt's 47 MB: 89-101 ms against 76-78 ms per pull, the
        # new file's pages are faulted in on both sides; BENCHMARKS.md).
        self.shared_memory = (bool(extra.get("shared_memory", False))
                              and os.path.isdir(_SHM_DIR))
        # Scheduler side.
        self._plan = TcpTransfers()
        self._sending: set[str] = set()  # do_remote_decode requests registered with the worker
        self._pulled: set[str] = set()  # consumer requests offered remote KV (never twice)
        # Worker side.
        self._caches: list[torch.Tensor] = []
        self._block_dim = 1
        self._convert: Any = None
        self._lock = threading.Lock()
        self._sendable: dict[str, _Sendable] = {}
        self._sent: set[str] = set()
        self._loads: dict[str, tuple[BlockPull, Future]] = {}
        self._cancelled: set[str] = set()  # pulls of ended requests: stop asking
        self._failed: set[str] = set()
        self._counts = KVTransferCounts()
        self._zmq: zmq.Context | None = None
        self._server: threading.Thread | None = None
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._tp_group: Any = None
        self._shm_files: list[tuple[float, str]] = []  # (written at, path): the server's

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """Every prompt token but the last, after the local hit, arriving asynchronously
        (for a request with do_remote_prefill)."""
        params = transfer_params(request)
        if not (self.config.is_consumer and params.get("do_remote_prefill")) or (
                request.request_id in self._pulled):
            return 0, False
        remote_size = int(params.get("remote_block_size", self.block_size))
        if remote_size != self.block_size:
            logger.warning("Request %s: the producer's KV blocks hold %d tokens, ours %d; "
                           "its prompt is computed here.", request.request_id, remote_size,
                           self.block_size)
            return 0, False
        count = request.num_prompt_tokens - 1 - num_computed_tokens
        return max(0, count), count > 0

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """Plan the pull of the blocks holding the external tokens."""
        if not num_external_tokens:
            return
        params = transfer_params(request)
        end = request.num_computed_tokens
        first, last = (end - num_external_tokens) // self.block_size, -(-end // self.block_size)
        remote = [int(b) for b in params.get("remote_block_ids") or []]
        self._pulled.add(request.request_id)
        self._plan.pulls.append(BlockPull(request.request_id, list(block_ids[first:last]),
                                          remote[first:last], RemoteRequest.from_params(params)))

    def build_connector_meta(self, scheduled: list[ScheduledKV]) -> TcpTransfers | None:
        """This step's pulls, and the prompt requests a peer will pull from us."""
        if self.config.is_producer:
            for request in scheduled:
                if request.kv_transfer_params.get("do_remote_decode"):
                    self._sending.add(request.request_id)
                    end = request.num_computed_tokens + request.num_scheduled_tokens
                    self._plan.sends.append(BlockSend(
                        request.request_id, list(request.block_ids),
                        end >= request.num_prompt_tokens))
        plan, self._plan = self._plan, TcpTransfers()
        return plan if plan else None

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        """Hold the blocks of a do_remote_decode request that finished by length, and
        say where to pull them from."""
        request_id = request.request_id
        params = transfer_params(request)
        if self.config.is_consumer and params.get("do_remote_prefill") and (
                request_id not in self._pulled):
            # Its prompt's KV came from elsewhere, or it ended first: never pulled.
            self._plan.releases.append(RemoteRequest.from_params(params))
        self._pulled.discard(request_id)
        if request_id not in self._sending:
            return False, None
        self._sending.discard(request_id)
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            self._plan.dropped.append(request_id)  # aborted or stopped: nobody will pull
            return False, None
        self._plan.held.append(request_id)
        return True, {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": self.engine_id, "remote_block_ids": list(block_ids),
            "remote_host": self.advertised_host, "remote_port": self.config.kv_port,
            "remote_request_id": request_id, "remote_block_size": self.block_size,
            "tp_size": 1,
        }

    # --------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: list[Any], block_dim: int) -> None:
        """The caches; a producer starts serving pulls (once: a runner rebuilt on waking
        registers its caches again)."""
        with self._lock:
            self._caches, self._block_dim = list(kv_caches), block_dim
        if self._zmq is None:
            self._tp_group = parallel_state.get_tp_group()
            self._zmq = zmq.Context()
            if self.config.is_producer:
                self._start_server()
            if self.config.is_consumer:
                self._pool = ThreadPoolExecutor(
                    int(self.config.kv_connector_extra_config.get("pull_threads", 4)),
                    thread_name_prefix="kv-pull")

    def set_row_converter(self, convert: Any) -> None:
        """For a peer whose KV cache dtype differs."""
        self._convert = convert

    def start_load_kv(self, metadata: Any) -> None:
        """Register this step's sends and held requests; start its pulls."""
        if metadata is None:
            return
        now = time.monotonic()
        with self._lock:
            for send in metadata.sends:
                entry = self._sendable.setdefault(send.request_id, _Sendable(send.block_ids))
                entry.block_ids = send.block_ids
            for request_id in metadata.held:
                if request_id in self._sendable:
                    self._sendable[request_id].deadline = now + self.lease_s
                else:  # never registered here (no prompt step): nothing to pull
                    self._sent.add(request_id)
            for request_id in metadata.dropped:
                self._sendable.pop(request_id, None)
        assert self._pool is not None or not (metadata.pulls or metadata.releases), (
            "pulls on a producer")
        for pull in metadata.pulls:
            assert self._pool is not None
            # The time to give up counts from now, not from when a thread is free.
            pull.deadline = now + self.pull_timeout_s
            self._loads[pull.request_id] = (pull, self._pool.submit(self._pull, pull))
        if self._is_first_rank():
            for release in metadata.releases:
                assert self._pool is not None
                self._pool.submit(self._release, release)

    def wait_for_save(self, metadata: Any) -> None:
        """The sends whose prompt this step finished may be pulled now."""
        if metadata is None:
            return
        with self._lock:
            for send in metadata.sends:
                if send.prompt_done and send.request_id in self._sendable:
                    self._sendable[send.request_id].ready = True

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Held requests pulled or past their lease; loads that arrived (written into the
        cache now, between steps)."""
        now = time.monotonic()
        with self._lock:
            expired = {request_id for request_id, entry in self._sendable.items()
                       if entry.deadline is not None and entry.deadline < now
                       and not entry.reading}
            for request_id in expired:
                del self._sendable[request_id]
                logger.warning("KV blocks of request %s were not pulled within %.0f s; "
                               "freed.", request_id, self.lease_s)
            sending, self._sent = self._sent | expired, set()
        received: set[str] = set()
        for request_id, everywhere_ok in self._finished_loads():
            pull, future = self._loads.pop(request_id)
            try:
                if not everywhere_ok:
                    future.result()  # this rank's own error, if it has one
                    raise RuntimeError("another rank's pull failed")
                blocks, seconds = future.result()
                self._write(pull, blocks)
            except Exception as error:  # noqa: BLE001 - the request fails, the engine goes on
                logger.warning("KV blocks of request %s failed to load from %s:%d (%s).",
                               request_id, pull.remote.host, pull.remote.port, error)
                self._failed.add(request_id)
                with self._lock:
                    self._counts.failures += 1
                continue
            received.add(request_id)
            with self._lock:
                self._counts.bytes_received += sum(_nbytes(b) for b in blocks)
                self._counts.seconds.append(seconds)
        return sending, received

    def _finished_loads(self) -> list[tuple[str, bool]]:
        """The loads every rank finished, and whether every rank's succeeded (the ranks
        hold the same loads in the same order: one all-gather of their states)."""
        if not self._loads:
            return []
        ids = list(self._loads)
        # On the caches' device: the group's collective may need it there (NCCL).
        states = torch.tensor([_state(self._loads[i][1]) for i in ids], dtype=torch.int64,
                              device=self._caches[0].device if self._caches else "cpu")
        group = self._tp_group
        if group is not None and group.world_size > 1:
            states = group.all_gather(states, dim=0).view(group.world_size, len(ids))
        else:
            states = states.view(1, len(ids))
        done = (states.min(0).values >= _DONE).tolist()
        ok = (states.max(0).values == _DONE).tolist()
        return [(i, bool(k)) for i, d, k in zip(ids, done, ok, strict=True) if d]

    def cancel_loads(self, request_ids: set[str]) -> None:
        """A load for an ended request is never written; its pull stops asking, and the
        producer is told to let the blocks go."""
        for request_id in request_ids:
            load = self._loads.pop(request_id, None)
            if load is None:
                continue
            pull, future = load
            if not future.done():
                with self._lock:
                    self._cancelled.add(pull.request_id)
            if future.cancel() and self._is_first_rank():  # it never started
                assert self._pool is not None
                self._pool.submit(self._release, pull.remote)

    def _is_first_rank(self) -> bool:
        return self._tp_group is None or self._tp_group.rank_in_group == 0

    def get_load_failures(self) -> set[str]:
        """Requests whose pull failed since the last call."""
        failed, self._failed = self._failed, set()
        return failed

    def take_transfer_counts(self) -> KVTransferCounts:
        """Bytes served and pulled, failures and transfer times since the last call."""
        with self._lock:
            counts, self._counts = self._counts, KVTransferCounts()
        return counts

    def shutdown(self) -> None:
        """Stop serving and pulling."""
        self._stop.set()
        if self._server is not None:
            self._server.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------- the producer's server

    def _start_server(self) -> None:
        assert self._zmq is not None
        socket = self._zmq.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        address = f"tcp://{self.config.kv_ip}:{self.config.kv_port}"
        try:
            socket.bind(address)
        except zmq.ZMQError as error:
            socket.close()
            raise ValueError(f"kv_transfer_config: cannot serve KV blocks at {address} "
                             f"({error}); choose another kv_port.") from None
        self._server = threading.Thread(target=self._serve, args=(socket,), daemon=True,
                                        name="kv-serve")
        self._server.start()

    def _serve(self, socket: zmq.Socket) -> None:
        try:
            while not self._stop.is_set():
                self._remove_stale_shm_files()
                if not socket.poll(100):
                    continue
                message = socket.recv_multipart()
                try:
                    header, frames = self._answer(json.loads(message[-1]))
                except Exception as error:  # noqa: BLE001 - a bad ask gets an error answer
                    header, frames = {"status": "error", "error": str(error)}, []
                socket.send_multipart([message[0], b"", json.dumps(header).encode(), *frames],
                                      copy=False)
        finally:
            socket.close()

    def _answer(self, ask: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        """The blocks a pull asks for, if their request is held here and computed."""
        request_id = str(ask["request_id"])
        if ask.get("release"):
            with self._lock:
                entry = self._sendable.get(request_id)
                if entry is not None and entry.reading:  # let the copy finish first
                    entry.deadline = 0.0
                elif entry is not None:
                    del self._sendable[request_id]
                    self._sent.add(request_id)
            return {"status": "ok"}, []
        block_ids = [int(b) for b in ask["block_ids"]]
        tp_size, tp_rank = int(ask.get("tp_size", 1)), int(ask.get("tp_rank", 0))
        with self._lock:
            entry = self._sendable.get(request_id)
            if entry is None:
                return {"status": "gone", "error": f"request {request_id} holds no blocks "
                        "here (never, or its lease ended)"}, []
            if not entry.ready:
                return {"status": "wait"}, []
            if not set(block_ids) <= set(entry.block_ids):
                return {"status": "error", "error": "blocks not held for this request"}, []
            if tp_rank in entry.served:
                return {"status": "error", "error": f"rank {tp_rank} pulled already"}, []
            entry.reading += 1
            caches, dim = self._caches, self._block_dim
        try:
            index = torch.tensor(block_ids, dtype=torch.long)
            # Blocks first on the wire, whatever the cache's layout (heads: dim 3 then);
            # a consumer rank gets the KV heads it holds.
            layers = [_heads(cache.index_select(dim, index).movedim(dim, 0), tp_size,
                             tp_rank).contiguous().cpu() for cache in caches]
        except BaseException:
            with self._lock:
                entry.reading -= 1
            raise
        with self._lock:
            entry.reading -= 1
            entry.served.add(tp_rank)
            if len(entry.served) >= tp_size:  # every rank has its heads
                self._sendable.pop(request_id, None)
                self._sent.add(request_id)
        header: dict[str, Any] = {
            "status": "ok", "dtype": str(layers[0].dtype).removeprefix("torch."),
            "shapes": [list(t.shape) for t in layers]}
        with self._lock:
            self._counts.bytes_sent += sum(_nbytes(t) for t in layers)
        if ask.get("shm") and os.path.isdir(_SHM_DIR):  # the consumer asked for it
            header["shm"] = self._write_shm_file(layers)
            return header, []
        return header, [t.view(torch.uint8).numpy() for t in layers]

    def _write_shm_file(self, layers: list[torch.Tensor]) -> str:
        """The layers one after another in a new file in /dev/shm (its reader removes it;
        the server does after a minute otherwise)."""
        path = os.path.join(_SHM_DIR, f"pagedllm-kv-{uuid.uuid4().hex}")
        with open(path, "wb") as out:
            for layer in layers:
                out.write(layer.view(torch.uint8).numpy().data)
        self._shm_files.append((time.monotonic(), path))
        return path

    def _remove_stale_shm_files(self) -> None:
        while self._shm_files and self._shm_files[0][0] < time.monotonic() - _SHM_KEEP_S:
            _, path = self._shm_files.pop(0)
            if os.path.exists(path):
                os.unlink(path)

    # -------------------------------------------------------------- the consumer's pulls

    def _pull(self, pull: BlockPull) -> tuple[list[torch.Tensor], float]:
        """Ask the producer for the blocks until it has them (or the time is up)."""
        if len(pull.remote_block_ids) != len(pull.local_block_ids):
            raise ValueError(f"kv_transfer_params remote_block_ids has "
                             f"{len(pull.remote_block_ids)} blocks where "
                             f"{len(pull.local_block_ids)} are needed")
        assert self._zmq is not None
        start = time.monotonic()
        deadline = pull.deadline or start + self.pull_timeout_s
        socket = self._zmq.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(f"tcp://{pull.remote.host}:{pull.remote.port}")
        group = self._tp_group
        ask = json.dumps({"request_id": pull.remote.request_id,
                          "block_ids": pull.remote_block_ids,
                          "tp_size": group.world_size if group is not None else 1,
                          "tp_rank": group.rank_in_group if group is not None else 0,
                          "shm": self.shared_memory and _is_this_host(pull.remote.host),
                          }).encode()
        try:
            while True:
                socket.send_multipart([b"", ask])
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not socket.poll(int(remaining * 1000) + 1):
                    raise TimeoutError(f"no answer within {self.pull_timeout_s:.0f} s")
                frames = socket.recv_multipart(copy=False)
                header = json.loads(frames[1].bytes)
                if header["status"] == "wait":
                    with self._lock:
                        cancelled = pull.request_id in self._cancelled
                    if cancelled or self._stop.is_set():
                        raise RuntimeError("cancelled")
                    time.sleep(_RETRY_S)
                    continue
                if header["status"] != "ok":
                    raise RuntimeError(header.get("error", header["status"]))
                dtype = getattr(torch, header["dtype"])
                if "shm" in header:
                    return (_read_shm_file(header["shm"], dtype, header["shapes"]),
                            time.monotonic() - start)
                # Views of the received frames, no copy: the step thread copies them
                # once, into the cache (they are read-only; nothing writes them).
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # "not writable"
                    blocks = [torch.frombuffer(frame.buffer, dtype=torch.uint8)
                              .view(dtype).reshape(shape)
                              for frame, shape in zip(frames[2:], header["shapes"],
                                                      strict=True)]
                return blocks, time.monotonic() - start
        finally:
            socket.close()
            with self._lock:
                self._cancelled.discard(pull.request_id)

    def _release(self, release: RemoteRequest) -> None:
        """Tell a producer to let a request's blocks go (best effort: its lease frees
        them otherwise)."""
        assert self._zmq is not None
        socket = self._zmq.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.connect(f"tcp://{release.host}:{release.port}")
            socket.send_multipart([b"", json.dumps({"request_id": release.request_id,
                                                    "release": True}).encode()])
            if socket.poll(1000):
                socket.recv_multipart()
        except zmq.ZMQError as error:
            logger.debug("Releasing %s failed (%s).", release.request_id, error)
        finally:
            socket.close()

    def _write(self, pull: BlockPull, blocks: list[torch.Tensor]) -> None:
        """The pulled blocks into this cache (converted where the dtypes differ)."""
        if len(blocks) != len(self._caches):
            raise ValueError(f"the producer has {len(blocks)} layers, this model "
                             f"{len(self._caches)}")
        index = torch.tensor(pull.local_block_ids, dtype=torch.long)
        converted = []
        for cache, layer in zip(self._caches, blocks, strict=True):
            layer = layer.movedim(0, self._block_dim)  # blocks come first on the wire
            if layer.dtype != cache.dtype:
                if self._convert is None:
                    raise ValueError(f"the producer's KV cache is {layer.dtype}, this one "
                                     f"{cache.dtype}, and no converter is set")
                layer = self._convert(layer, cache.dtype)
            expected = list(cache.shape)
            expected[self._block_dim] = len(pull.local_block_ids)
            if list(layer.shape) != expected:
                raise ValueError(f"the producer's blocks are {list(layer.shape)}, this "
                                 f"cache's {expected}")
            converted.append(layer)
        for cache, layer in zip(self._caches, converted, strict=True):  # all or nothing
            cache.index_copy_(self._block_dim, index, layer.to(cache.device))


def _is_this_host(host: str) -> bool:
    """Whether a peer's address is this machine's loopback (shared memory reaches it)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_shm_file(path: str, dtype: torch.dtype, shapes: list[list[int]]
                   ) -> list[torch.Tensor]:
    """A producer's handed-over layers, read and the file removed."""
    try:
        data = torch.empty(os.path.getsize(path), dtype=torch.uint8)
        with open(path, "rb") as source:
            source.readinto(data.numpy().data)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    layers, offset = [], 0
    for shape in shapes:
        size = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        layers.append(data[offset:offset + size].view(dtype).reshape(shape))
        offset += size
    return layers


def _heads(blocks: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    """The KV heads consumer rank `tp_rank` of `tp_size` holds, of blocks laid out
    [blocks, 2, block_size, kv_heads, row]."""
    if tp_size == 1:
        return blocks
    heads = kv_head_range(blocks.shape[3], tp_size, tp_rank)
    return blocks[:, :, :, heads.start:heads.stop]


def _state(future: Future) -> int:
    if not future.done():
        return _PENDING
    return _FAILED if future.exception() is not None else _DONE


def _nbytes(tensor: torch.Tensor) -> int:
    return int(tensor.numel()) * int(tensor.element_size())
