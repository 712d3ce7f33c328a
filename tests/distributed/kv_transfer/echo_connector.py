"""A connector of a test's own (loaded with kv_connector_module_path): it reports, when a
request finishes, the kv_transfer_params it was given and how many blocks it held."""

from __future__ import annotations

from typing import Any

from pagedllm.distributed.kv_transfer import KVConnectorBase


class EchoConnector(KVConnectorBase):
    """Moves nothing; echoes the request's kv_transfer_params."""

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        given = (request.sampling_params.extra_args or {}).get("kv_transfer_params")
        return False, {"echo": given, "num_blocks": len(block_ids),
                       "engine_id": self.config.engine_id}
