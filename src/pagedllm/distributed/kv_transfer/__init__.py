"""KV transfer: connectors that move KV cache blocks between an engine and a store or a
peer (vLLM v1's interface, `kv_transfer_config`). The scheduler and the worker call a
connector's two halves (base.py); a connector calls nothing of the engine."""

from pagedllm.distributed.kv_transfer.base import (
    KVConnectorBase,
    KVConnectorOutput,
    KVConnectorRole,
    ScheduledKV,
)
from pagedllm.distributed.kv_transfer.config import KVTransferConfig
from pagedllm.distributed.kv_transfer.factory import connector_names, make_connector

__all__ = ["KVConnectorBase", "KVConnectorOutput", "KVConnectorRole", "KVTransferConfig",
           "ScheduledKV", "connector_names", "make_connector"]
