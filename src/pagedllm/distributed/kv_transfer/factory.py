"""Connectors by name (vLLM's names), built per role."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedllm.distributed.kv_transfer.base import KVConnectorBase, KVConnectorRole
    from pagedllm.distributed.kv_transfer.config import KVTransferConfig

# Name -> "module:Class" (imported when used).
_CONNECTORS = {
    "SharedStorageConnector": "pagedllm.distributed.kv_transfer.shared_storage:"
                              "SharedStorageConnector",
    # vLLM's newer name of its example connector.
    "ExampleConnector": "pagedllm.distributed.kv_transfer.shared_storage:"
                        "SharedStorageConnector",
    "OffloadingConnector": "pagedllm.distributed.kv_transfer.offloading:OffloadingConnector",
    "MultiConnector": "pagedllm.distributed.kv_transfer.multi:MultiConnector",
}


def connector_names() -> list[str]:
    """The names kv_connector takes."""
    return sorted(_CONNECTORS)


def make_connector(config: KVTransferConfig, role: KVConnectorRole, block_size: int,
                   bytes_per_block: int) -> KVConnectorBase:
    """The connector `config` names, for `role` (a KV cache of `block_size`-token blocks of
    `bytes_per_block` bytes)."""
    import importlib

    module_name, _, class_name = _CONNECTORS[config.kv_connector].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    connector: KVConnectorBase = cls(config, role, block_size, bytes_per_block)
    return connector
