"""SharedStorageConnector (vLLM's example connector, also `ExampleConnector`): KV blocks
saved to and loaded from a folder, one file per block, named by the block's hash.

A producer saves every full prompt block it computes (once: a block already on disk is
skipped); a consumer, admitting a request, counts how many of its next full prompt blocks
are on disk and loads them into the blocks allocated for them before the step's forward,
so any two engines on one host (or one engine across restarts) share prefixes through the
folder. The last prompt token is always computed (its logits start the answer). Files are
written to a temporary name and renamed, so a reader never sees half a block. A block hash
chains every token before it (and the LoRA adapter and cache salt), so equal names mean
equal prefixes. Option (`kv_connector_extra_config`): `shared_storage_path` (default
"local_storage").
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from pagedllm.distributed.kv_transfer.base import KVConnectorBase, KVConnectorRole, ScheduledKV
from pagedllm.distributed.kv_transfer.config import KVTransferConfig
from pagedllm.logger import init_logger

logger = init_logger(__name__)


@dataclass
class SharedStorageMetadata:
    """One step's file moves: the blocks to load before the forward (with the request
    they are for) and to save after it."""

    loads: list[tuple[str, int, str]] = field(default_factory=list)  # (request, block, file)
    saves: list[tuple[int, str]] = field(default_factory=list)


class SharedStorageConnector(KVConnectorBase):
    """Blocks through a folder (see the module docstring)."""

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int) -> None:
        super().__init__(config, role, block_size)
        extra = config.kv_connector_extra_config
        self.path = str(extra.get("shared_storage_path", "local_storage"))
        os.makedirs(self.path, exist_ok=True)
        # Scheduler side: loads decided at admission, sent with the next metadata.
        self._pending_loads: list[tuple[str, int, str]] = []
        # Worker side.
        self._kv_caches: list[Any] = []
        self._block_dim = 0
        self._failed_loads: set[str] = set()

    def block_file(self, block_hash: bytes) -> str:
        """Where the block with this hash is kept."""
        return os.path.join(self.path, f"{block_hash.hex()}.safetensors")

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """The run of prompt blocks on disk from `num_computed_tokens` on (synchronous)."""
        if not self.config.is_consumer:
            return 0, False
        size = self.block_size
        # Whole blocks only, and never the last prompt token: its logits are needed.
        last_block = (request.num_prompt_tokens - 1) // size
        first_block = num_computed_tokens // size
        hashes = request.block_hashes
        found = first_block
        while found < min(last_block, len(hashes)) and os.path.exists(
                self.block_file(hashes[found])):
            found += 1
        return max(0, found * size - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """Load the blocks of the external tokens (the last ones computed at admission)."""
        if num_external_tokens == 0:
            return
        size = self.block_size
        end = request.num_computed_tokens // size
        start = end - num_external_tokens // size
        for index in range(start, end):
            self._pending_loads.append((request.request_id, block_ids[index],
                                        self.block_file(request.block_hashes[index])))

    def build_connector_meta(self, scheduled: list[ScheduledKV]) -> SharedStorageMetadata | None:
        """This step's loads, and the full prompt blocks it computes that are not on disk."""
        meta = SharedStorageMetadata(loads=self._pending_loads)
        self._pending_loads = []
        if self.config.is_producer:
            for request in scheduled:
                meta.saves.extend(self._new_full_blocks(request))
        return meta if (meta.loads or meta.saves) else None

    def _new_full_blocks(self, request: ScheduledKV) -> list[tuple[int, str]]:
        size = self.block_size
        end = min(request.num_computed_tokens + request.num_scheduled_tokens,
                  request.num_prompt_tokens) // size
        start = request.num_computed_tokens // size
        saves = []
        for index in range(start, min(end, len(request.block_hashes))):
            path = self.block_file(request.block_hashes[index])
            if not os.path.exists(path):
                saves.append((request.block_ids[index], path))
        return saves

    # --------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: list[Any], block_dim: int) -> None:
        """Every layer's cache tensor and the dimension indexing blocks."""
        self._kv_caches = list(kv_caches)
        self._block_dim = block_dim

    def start_load_kv(self, metadata: Any) -> None:
        """Copy each file's layers into its block (synchronously, before the forward); a
        file gone or unreadable fails its request (`get_load_failures`)."""
        if metadata is None:
            return
        from safetensors.torch import load_file

        for request_id, block_id, path in metadata.loads:
            try:
                tensors = load_file(path)
                for layer, cache in enumerate(self._kv_caches):
                    cache.select(self._block_dim, block_id).copy_(tensors[f"layer.{layer}"])
            except Exception as error:  # noqa: BLE001 - the request fails, the engine goes on
                logger.warning("KV block file %s failed to load (%s): request %s fails.",
                               path, error, request_id)
                self._failed_loads.add(request_id)

    def get_load_failures(self) -> set[str]:
        """Requests whose blocks failed to load since the last call."""
        failed, self._failed_loads = self._failed_loads, set()
        return failed

    def wait_for_save(self, metadata: Any) -> None:
        """Write each new full block's layers to its file (after the forward wrote them)."""
        if metadata is None or not metadata.saves:
            return
        from safetensors.torch import save_file

        for block_id, path in metadata.saves:
            if os.path.exists(path):
                continue
            tensors = {f"layer.{layer}": cache.select(self._block_dim, block_id).contiguous()
                       for layer, cache in enumerate(self._kv_caches)}
            handle, temporary = tempfile.mkstemp(dir=self.path, suffix=".part")
            os.close(handle)
            save_file(tensors, temporary)
            os.replace(temporary, path)  # whole or not at all, for readers
