"""OffloadingConnector (`--kv-offloading-size GiB`, `--kv-offloading-path`): a second tier
for the prefix cache, in host memory or on disk, least recently used first out.

Every full prompt block an engine computes is copied to the tier once (block_store.py); a
request whose next blocks the tier holds, beyond the KV cache's own prefix hit, loads them
instead of computing them. So a prefix the KV cache evicted long ago comes back as a copy,
not a prefill. The tier holds `kv_offloading_size` GiB of blocks; the least recently saved
or loaded go first. With a path the blocks are files (named by hash, as the shared-storage
connector's), so a restarted engine finds the tier it left: a long repeated system prompt is
answered from it (reported as cached tokens). The scheduler keeps the tier's index (it
decides every save, load and drop); the worker keeps the blocks.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from typing import Any

from pagedllm.distributed.kv_transfer.base import KVConnectorRole
from pagedllm.distributed.kv_transfer.block_store import BlockStoreConnector
from pagedllm.distributed.kv_transfer.config import KVTransferConfig
from pagedllm.distributed.kv_transfer.shared_storage import write_block_file

_SUFFIX = ".safetensors"


class OffloadingConnector(BlockStoreConnector):
    """The prefix cache's second tier (see the module docstring).

    Options (`kv_connector_extra_config`): `kv_offloading_size` (GiB, required),
    `kv_offloading_path` (a folder: the tier on disk; none: in host memory).
    """

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int,
                 bytes_per_block: int = 0) -> None:
        super().__init__(config, role, block_size)
        self._init_moves()
        extra = config.kv_connector_extra_config
        size = extra.get("kv_offloading_size")
        if not isinstance(size, int | float) or size <= 0:
            raise ValueError("OffloadingConnector needs kv_offloading_size > 0 (GiB).")
        if bytes_per_block <= 0:
            raise ValueError("OffloadingConnector needs the KV cache's bytes per block.")
        self.capacity = max(1, int(size * 2**30) // bytes_per_block)
        path = extra.get("kv_offloading_path")
        self.path = str(path) if path else None
        self._index: OrderedDict[str, None] = OrderedDict()  # scheduler side, LRU first
        self._dropped: list[str] = []
        self._blocks: dict[str, dict[str, Any]] = {}  # worker side, host memory tier
        if self.path is not None:
            os.makedirs(self.path, exist_ok=True)
            if role is KVConnectorRole.SCHEDULER:
                self._load_index()

    def _load_index(self) -> None:
        """A restarted engine's tier: the folder's blocks, oldest first."""
        assert self.path is not None
        names = [n for n in os.listdir(self.path) if n.endswith(_SUFFIX)]
        names.sort(key=lambda n: os.path.getmtime(os.path.join(self.path or "", n)))
        for name in names:
            self._index[name.removesuffix(_SUFFIX)] = None
        self._evict()

    def _evict(self) -> None:
        while len(self._index) > self.capacity:
            key, _ = self._index.popitem(last=False)
            self._dropped.append(key)

    # ------------------------------------------------------------------ scheduler side

    def has(self, key: str) -> bool:
        """In the tier's index."""
        return key in self._index

    def on_saved(self, key: str) -> None:
        """Newest in the tier; the oldest go past capacity."""
        self._index[key] = None
        self._index.move_to_end(key)
        self._evict()

    def on_loaded(self, key: str) -> None:
        """Used: newest again."""
        if key in self._index:
            self._index.move_to_end(key)

    def take_dropped(self) -> list[str]:
        """Blocks past capacity since the last call."""
        dropped, self._dropped = self._dropped, []
        return dropped

    # --------------------------------------------------------------------- worker side

    def _file(self, key: str) -> str:
        assert self.path is not None
        return os.path.join(self.path, key + _SUFFIX)

    def write(self, key: str, tensors: dict[str, Any]) -> None:
        """Into host memory, or a file."""
        if self.path is None:
            self._blocks[key] = tensors
        elif not os.path.exists(self._file(key)):
            write_block_file(self.path, self._file(key), tensors)

    def read(self, key: str) -> dict[str, Any]:
        """From host memory, or its file."""
        if self.path is None:
            return self._blocks[key]
        from safetensors.torch import load_file

        return load_file(self._file(key))

    def drop(self, key: str) -> None:
        """Let it go (a file is deleted)."""
        if self.path is None:
            self._blocks.pop(key, None)
            return
        # Another engine's tier on the same folder may have let it go first.
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._file(key))
