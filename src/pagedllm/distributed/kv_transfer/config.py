"""KVTransferConfig: vLLM's `kv_transfer_config`, field for field (plain data)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
LOAD_FAILURE_POLICIES = ("fail", "recompute")


@dataclass(frozen=True)
class KVTransferConfig:
    """How an engine moves KV cache blocks through a connector.

    Attributes:
        kv_connector: the connector's name (distributed/kv_transfer/factory.py).
        kv_role: kv_producer (saves or sends), kv_consumer (loads or receives) or kv_both.
        engine_id: this engine's id among its peers (None: made up).
        kv_rank / kv_parallel_size: this instance's rank among the transfer's instances.
        kv_ip / kv_port: where a network connector listens or connects.
        kv_buffer_size: bytes a connector may buffer.
        kv_connector_extra_config: the connector's own options (a shared storage's path).
        kv_load_failure_policy: when a block fails to load, fail the request or recompute.
        kv_connector_module_path: a module holding a connector class named kv_connector
            (a connector of one's own, as vLLM loads them).
    """

    kv_connector: str
    kv_role: str = "kv_both"
    engine_id: str | None = None
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_buffer_size: float = 1e9
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_load_failure_policy: str = "fail"
    kv_connector_module_path: str | None = None

    def __post_init__(self) -> None:
        from pagedllm.distributed.kv_transfer.factory import connector_names

        if self.kv_connector_module_path is None and self.kv_connector not in connector_names():
            raise ValueError(f"kv_transfer_config kv_connector {self.kv_connector!r} is not "
                             f"known; choose one of {', '.join(connector_names())}.")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config kv_role must be one of {KV_ROLES}, got "
                             f"{self.kv_role!r}.")
        if self.kv_load_failure_policy not in LOAD_FAILURE_POLICIES:
            raise ValueError(f"kv_transfer_config kv_load_failure_policy must be one of "
                             f"{LOAD_FAILURE_POLICIES}, got {self.kv_load_failure_policy!r}.")
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError("kv_transfer_config kv_connector_extra_config must be an object.")

    @property
    def is_producer(self) -> bool:
        """It saves (or sends) the KV it computes."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        """It loads (or receives) KV it did not compute."""
        return self.kv_role in ("kv_consumer", "kv_both")

    @classmethod
    def parse(cls, value: Any) -> KVTransferConfig:
        """From a dict or its JSON text (ValueError naming an unknown key)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"kv_transfer_config is not valid JSON: {error}.") from None
        if not isinstance(value, dict):
            raise ValueError(f"kv_transfer_config must be an object, got {value!r}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"kv_transfer_config has unknown keys {unknown}; known: "
                             f"{sorted(known)}.")
        if "kv_connector" not in value:
            raise ValueError("kv_transfer_config needs kv_connector.")
        return cls(**value)
