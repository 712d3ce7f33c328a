"""MultiConnector (vLLM's): several connectors as one, e.g. a folder shared with other
engines plus the offloading tier.

Config: `{"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors":
[{...a kv_transfer_config...}, ...]}}`. At admission the connectors are asked in order and
the first that has tokens provides them (only it loads); every connector saves what it
saves; a step's plan is each connector's own; a finished request's blocks wait while any
connector asks it to, and the first connector's `kv_transfer_params` are reported.
"""

from __future__ import annotations

from typing import Any

from pagedllm.distributed.kv_transfer.base import KVConnectorBase, KVConnectorRole, ScheduledKV
from pagedllm.distributed.kv_transfer.config import KVTransferConfig
from pagedllm.metrics.stats import KVTransferCounts


class MultiConnector(KVConnectorBase):
    """Connectors in order (see the module docstring)."""

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int,
                 bytes_per_block: int = 0) -> None:
        from pagedllm.distributed.kv_transfer.factory import make_connector

        super().__init__(config, role, block_size, bytes_per_block)
        specs = config.kv_connector_extra_config.get("connectors")
        if not isinstance(specs, list) or len(specs) < 2:
            raise ValueError("MultiConnector needs kv_connector_extra_config.connectors: a "
                             "list of at least two kv_transfer_configs.")
        parts = [KVTransferConfig.parse(spec) for spec in specs]
        if any(part.kv_connector == "MultiConnector" for part in parts):
            raise ValueError("MultiConnector connectors cannot nest a MultiConnector.")
        self.connectors = [make_connector(part, role, block_size, bytes_per_block)
                           for part in parts]
        self._chosen: dict[str, int] = {}  # request id -> the connector that provides

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """The first connector's tokens that has any."""
        self._chosen.pop(request.request_id, None)
        for index, connector in enumerate(self.connectors):
            count, is_async = connector.get_num_new_matched_tokens(request, num_computed_tokens)
            if count:
                self._chosen[request.request_id] = index
                return count, is_async
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """Only the chosen connector loads."""
        chosen = self._chosen.pop(request.request_id, None)
        for index, connector in enumerate(self.connectors):
            connector.update_state_after_alloc(
                request, block_ids, num_external_tokens if index == chosen else 0)

    def build_connector_meta(self, scheduled: list[ScheduledKV]) -> Any:
        """Each connector's plan (None when none has one)."""
        plans = [connector.build_connector_meta(scheduled) for connector in self.connectors]
        return None if all(plan is None for plan in plans) else plans

    def load_failed(self, request: Any) -> None:
        """Every connector offers it nothing again."""
        for connector in self.connectors:
            connector.load_failed(request)

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        """Held while any asks; the first connector's params."""
        delay, params = False, None
        for connector in self.connectors:
            held, own = connector.request_finished(request, block_ids)
            delay = delay or held
            params = params if params is not None else own
        return delay, params

    # --------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: list[Any], block_dim: int) -> None:
        """Every connector's."""
        for connector in self.connectors:
            connector.register_kv_caches(kv_caches, block_dim)

    def start_load_kv(self, metadata: Any) -> None:
        """Each connector's loads."""
        for connector, plan in zip(self.connectors, metadata or [None] * len(self.connectors),
                                   strict=True):
            connector.start_load_kv(plan)

    def wait_for_save(self, metadata: Any) -> None:
        """Each connector's saves."""
        for connector, plan in zip(self.connectors, metadata or [None] * len(self.connectors),
                                   strict=True):
            connector.wait_for_save(plan)

    def set_row_converter(self, convert: Any) -> None:
        """Every connector's."""
        for connector in self.connectors:
            connector.set_row_converter(convert)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                 set[str] | None]:
        """Any connector's finished transfers."""
        sending: set[str] = set()
        recving: set[str] = set()
        for connector in self.connectors:
            sent, received = connector.get_finished(finished_req_ids)
            sending |= sent or set()
            recving |= received or set()
        return sending, recving

    def shutdown(self) -> None:
        """Every connector's."""
        for connector in self.connectors:
            connector.shutdown()

    def cancel_loads(self, request_ids: set[str]) -> None:
        """Every connector's."""
        for connector in self.connectors:
            connector.cancel_loads(request_ids)

    def get_load_failures(self) -> set[str]:
        """Any connector's."""
        failed: set[str] = set()
        for connector in self.connectors:
            failed |= connector.get_load_failures()
        return failed

    def take_transfer_counts(self) -> KVTransferCounts:
        """All connectors' traffic together."""
        total = KVTransferCounts()
        for connector in self.connectors:
            counts = connector.take_transfer_counts()
            if counts is not None:
                total.add(counts)
        return total
