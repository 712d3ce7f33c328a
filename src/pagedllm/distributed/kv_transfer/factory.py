"""Connectors by name (vLLM's names), built per role."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

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
    "TcpConnector": "pagedllm.distributed.kv_transfer.tcp:TcpConnector",
    # vLLM's pull-style network connector: the same kv_transfer_params, over TCP here.
    "NixlConnector": "pagedllm.distributed.kv_transfer.tcp:TcpConnector",
}


def connector_names() -> list[str]:
    """The names kv_connector takes."""
    return sorted(_CONNECTORS)


def make_connector(config: KVTransferConfig, role: KVConnectorRole, block_size: int,
                   bytes_per_block: int) -> KVConnectorBase:
    """The connector `config` names, for `role` (a KV cache of `block_size`-token blocks of
    `bytes_per_block` bytes)."""
    import importlib

    if config.kv_connector_module_path is not None:  # one's own connector
        module_name, class_name = config.kv_connector_module_path, config.kv_connector
    else:
        module_name, _, class_name = _CONNECTORS[config.kv_connector].partition(":")
    cls: Any
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"kv_transfer_config: no connector {class_name!r} in "
                         f"{module_name!r} ({error}).") from None
    if not (isinstance(cls, type) and issubclass(cls, _base())):
        raise ValueError(f"kv_transfer_config: {class_name!r} is not a KVConnectorBase.")
    return cast("KVConnectorBase", cls(config, role, block_size, bytes_per_block))


def _base() -> type[KVConnectorBase]:
    from pagedllm.distributed.kv_transfer.base import KVConnectorBase

    return KVConnectorBase
