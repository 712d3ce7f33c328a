"""SharedStorageConnector (vLLM's example connector, also `ExampleConnector`): KV blocks
saved to and loaded from a folder, one file per block, named by the block's hash.

A producer saves every full prompt block it computes (once: a block already on disk is
skipped); a consumer, admitting a request, loads the run of its next full prompt blocks it
finds on disk instead of computing them (block_store.py), so any two engines on one host (or
one engine across restarts) share prefixes through the folder. Files are written to a
temporary name and renamed, so a reader never sees half a block. A block hash chains every
token before it (and the LoRA adapter and cache salt), so equal names mean equal prefixes.
Option (`kv_connector_extra_config`): `shared_storage_path` (default "local_storage").
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from pagedllm.distributed.kv_transfer.base import KVConnectorRole
from pagedllm.distributed.kv_transfer.block_store import BlockStoreConnector
from pagedllm.distributed.kv_transfer.config import KVTransferConfig


class SharedStorageConnector(BlockStoreConnector):
    """Blocks through a folder (see the module docstring)."""

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int,
                 bytes_per_block: int = 0) -> None:
        super().__init__(config, role, block_size)
        self._init_moves()
        self.path = str(config.kv_connector_extra_config.get("shared_storage_path",
                                                             "local_storage"))
        os.makedirs(self.path, exist_ok=True)

    def block_file(self, key: str) -> str:
        """Where the block with this key (its hash, hex) is kept."""
        return os.path.join(self.path, f"{key}.safetensors")

    def has(self, key: str) -> bool:
        """A file holds it."""
        return os.path.exists(self.block_file(key))

    def write(self, key: str, tensors: dict[str, Any]) -> None:
        """Write to a temporary file, then rename (whole or not at all, for readers)."""
        path = self.block_file(key)
        if os.path.exists(path):
            return
        write_block_file(self.path, path, tensors)

    def read(self, key: str) -> dict[str, Any]:
        """The file's layers."""
        from safetensors.torch import load_file

        return load_file(self.block_file(key))


def write_block_file(folder: str, path: str, tensors: dict[str, Any]) -> None:
    """Save a block's layers at `path` atomically (a temporary file in `folder`, renamed)."""
    from safetensors.torch import save_file

    handle, temporary = tempfile.mkstemp(dir=folder, suffix=".part")
    os.close(handle)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, temporary)
    os.replace(temporary, path)
