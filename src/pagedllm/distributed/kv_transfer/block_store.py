"""A connector over a store of whole KV blocks keyed by block hash: the logic the folder
connector (shared_storage.py) and the offloading tier (offloading.py) share.

Scheduler half: at admission, the run of the request's next full prompt blocks the store
holds (never the block of the last prompt token: its logits are needed) is loaded instead of
computed; each step, the full prompt blocks it computes that the store lacks are saved.
Worker half: loads before the forward (a block that fails to load fails its request), saves
after it. A subclass says what the store holds (`has`), where a block goes (`write`), where
it comes from (`read`), and which blocks it lets go (`take_dropped`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pagedllm.distributed.kv_transfer.base import KVConnectorBase, ScheduledKV
from pagedllm.logger import init_logger
from pagedllm.metrics.stats import KVTransferCounts

logger = init_logger(__name__)


@dataclass
class BlockMoves:
    """One step's block moves: loads before the forward (with the request each is for),
    saves after it, and blocks the store drops (keys: hashes as hex)."""

    loads: list[tuple[str, int, str]] = field(default_factory=list)  # (request, block, key)
    saves: list[tuple[str, int, str]] = field(default_factory=list)  # (request, block, key)
    drops: list[str] = field(default_factory=list)


class BlockStoreConnector(KVConnectorBase):
    """Whole blocks to and from a store by hash (see the module docstring)."""

    def _init_moves(self) -> None:
        self._pending_loads: list[tuple[str, int, str]] = []  # scheduler side
        self._no_loads: set[str] = set()  # requests whose load failed: they compute
        self._kv_caches: list[Any] = []  # worker side
        self._block_dim = 0
        self._failed_loads: set[str] = set()
        self._counts = KVTransferCounts()

    # -------------------------------------------------------------- the store's part

    def has(self, key: str) -> bool:
        """Whether the store holds the block (scheduler side)."""
        raise NotImplementedError

    def on_saved(self, key: str) -> None:  # noqa: B027 - optional bookkeeping
        """The scheduler planned a save of `key` (a capacity-bound store records it)."""

    def on_loaded(self, key: str) -> None:  # noqa: B027 - optional bookkeeping
        """The scheduler planned a load of `key` (an LRU store marks it used)."""

    def take_dropped(self) -> list[str]:
        """Blocks the store lets go since the last call (scheduler side)."""
        return []

    def write(self, key: str, tensors: dict[str, Any]) -> None:
        """Keep a block's layers (worker side)."""
        raise NotImplementedError

    def read(self, key: str) -> dict[str, Any]:
        """A block's layers (worker side; raises when it is gone or unreadable)."""
        raise NotImplementedError

    def drop(self, key: str) -> None:  # noqa: B027 - a store may keep everything
        """Let a block go (worker side)."""

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """The run of prompt blocks the store holds from `num_computed_tokens` on."""
        if not self.config.is_consumer or request.request_id in self._no_loads:
            return 0, False
        size = self.block_size
        last_block = (request.num_prompt_tokens - 1) // size
        hashes = request.block_hashes
        found = num_computed_tokens // size
        while found < min(last_block, len(hashes)) and self.has(hashes[found].hex()):
            found += 1
        return max(0, found * size - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """Load the blocks of the external tokens (the last ones computed at admission)."""
        size = self.block_size
        end = request.num_computed_tokens // size
        for index in range(end - num_external_tokens // size, end):
            key = request.block_hashes[index].hex()
            self.on_loaded(key)
            self._pending_loads.append((request.request_id, block_ids[index], key))

    def load_failed(self, request: Any) -> None:
        """It computes its prompt itself from now on."""
        self._no_loads.add(request.request_id)

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        """Nothing is held: saved blocks are the store's own copies."""
        self._no_loads.discard(request.request_id)
        return False, None

    def build_connector_meta(self, scheduled: list[ScheduledKV]) -> BlockMoves | None:
        """This step's loads, the saves of new full prompt blocks, the store's drops."""
        moves = BlockMoves(loads=self._pending_loads)
        self._pending_loads = []
        if self.config.is_producer:
            planned: set[str] = set()
            for request in scheduled:
                for block_id, key in self._new_full_blocks(request):
                    if key not in planned:
                        planned.add(key)
                        self.on_saved(key)
                        moves.saves.append((request.request_id, block_id, key))
        moves.drops = self.take_dropped()
        return moves if (moves.loads or moves.saves or moves.drops) else None

    def _new_full_blocks(self, request: ScheduledKV) -> list[tuple[int, str]]:
        size = self.block_size
        end = min(request.num_computed_tokens + request.num_scheduled_tokens,
                  request.num_prompt_tokens) // size
        start = request.num_computed_tokens // size
        return [(request.block_ids[index], request.block_hashes[index].hex())
                for index in range(start, min(end, len(request.block_hashes)))
                if not self.has(request.block_hashes[index].hex())]

    # --------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: list[Any], block_dim: int) -> None:
        """Every layer's cache tensor and the dimension indexing blocks."""
        self._kv_caches = list(kv_caches)
        self._block_dim = block_dim

    def start_load_kv(self, metadata: Any) -> None:
        """Copy each stored block into its block of the cache (before the forward)."""
        if metadata is None or not metadata.loads:
            return
        start = time.perf_counter()
        for request_id, block_id, key in metadata.loads:
            try:
                tensors = self.read(key)
                for layer, cache in enumerate(self._kv_caches):
                    cache.select(self._block_dim, block_id).copy_(tensors[f"layer.{layer}"])
                self._counts.bytes_received += _nbytes(tensors)
            except Exception as error:  # noqa: BLE001 - the request fails, the engine goes on
                logger.warning("KV block %s failed to load (%s) for request %s.",
                               key, error, request_id)
                self._failed_loads.add(request_id)
                self._counts.failures += 1
        self._counts.seconds.append(time.perf_counter() - start)

    def wait_for_save(self, metadata: Any) -> None:
        """Store each new full block (after the forward wrote it), then apply drops."""
        if metadata is None:
            return
        if metadata.saves:
            start = time.perf_counter()
            for request_id, block_id, key in metadata.saves:
                if request_id in self._failed_loads:
                    continue  # computed over blocks that did not load: never stored
                tensors = {
                    f"layer.{layer}": cache.select(self._block_dim, block_id).to("cpu", copy=True)
                    for layer, cache in enumerate(self._kv_caches)}
                try:
                    self.write(key, tensors)
                except OSError as error:  # a full disk fails the save, not the engine
                    logger.warning("KV block %s could not be saved (%s).", key, error)
                    self._counts.failures += 1
                    continue
                self._counts.bytes_sent += _nbytes(tensors)
            self._counts.seconds.append(time.perf_counter() - start)
        for key in metadata.drops:
            self.drop(key)

    def take_transfer_counts(self) -> KVTransferCounts:
        """This worker's traffic since the last call."""
        counts, self._counts = self._counts, KVTransferCounts()
        return counts

    def get_load_failures(self) -> set[str]:
        """Requests whose blocks failed to load since the last call."""
        failed, self._failed_loads = self._failed_loads, set()
        return failed


def _nbytes(tensors: dict[str, Any]) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors.values())
