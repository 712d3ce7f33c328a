"""The KV connector interface, in vLLM v1's two halves.

The scheduler half decides: how many of a request's next tokens a peer or a store already
has (`get_num_new_matched_tokens`), what to load into the blocks allocated for them
(`update_state_after_alloc`), each step's plan for the workers (`build_connector_meta`), and
whether a finished request's blocks must outlive it (`request_finished`). The worker half
moves bytes: `register_kv_caches`, `start_load_kv` before the forward, `wait_for_layer_load`
/ `save_kv_layer` per layer where a connector overlaps them with compute, `wait_for_save`
after it, `get_finished` for asynchronous transfers. The engine calls the connector; the
connector calls nothing of the engine: it gets plain data (`ScheduledKV`, block ids, the
request's block hashes).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedllm.distributed.kv_transfer.config import KVTransferConfig


class KVConnectorRole(enum.Enum):
    """Which half a connector object serves."""

    SCHEDULER = "scheduler"
    WORKER = "worker"


@dataclass(frozen=True)
class ScheduledKV:
    """One request of a step, as the scheduler half sees it.

    Attributes:
        request_id: its id.
        block_hashes: its full blocks' hashes (block i covers tokens [i * size, ...)).
        block_ids: its block table (KV cache group 0).
        num_computed_tokens: tokens computed before this step.
        num_scheduled_tokens: tokens this step computes.
        num_prompt_tokens: its prompt's length.
        kv_transfer_params: the request's own kv_transfer_params (vLLM's; {} if none).
    """

    request_id: str
    block_hashes: list[bytes]
    block_ids: list[int]
    num_computed_tokens: int
    num_scheduled_tokens: int
    num_prompt_tokens: int
    kv_transfer_params: dict[str, Any] = field(default_factory=dict)


def transfer_params(request: Any) -> dict[str, Any]:
    """A request's own kv_transfer_params, where vLLM carries them
    (`SamplingParams.extra_args`); {} when it has none."""
    extra = request.sampling_params.extra_args or {}
    params = extra.get("kv_transfer_params")
    return params if isinstance(params, dict) else {}


@dataclass
class KVConnectorOutput:
    """A step's news of asynchronous transfers (worker → scheduler; vLLM's).

    Attributes:
        finished_sending: finished requests whose held blocks a peer pulled (or whose
            lease ran out): the scheduler frees them now.
        finished_recving: requests whose KV finished loading: they may run.
        failed_recving: requests whose KV failed to load (kv_load_failure_policy says
            whether they fail or compute it themselves).
    """

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.finished_sending or self.finished_recving or self.failed_recving)


class KVConnectorBase:
    """A connector: both halves, one object per role (see the module docstring).

    Args:
        config: the engine's kv_transfer_config.
        role: the half this object serves.
        block_size: tokens per KV block.
        bytes_per_block: a block's bytes over all layers (a capacity-bound store's unit).
    """

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, block_size: int,
                 bytes_per_block: int = 0) -> None:
        self.config = config
        self.role = role
        self.block_size = block_size

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """Tokens after `num_computed_tokens` the connector can provide, and whether they
        arrive asynchronously (the request then waits for them)."""
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """Blocks were allocated for the request; the last `num_external_tokens` of its
        computed tokens are to be loaded into them."""

    def build_connector_meta(self, scheduled: list[ScheduledKV]) -> Any:
        """This step's plan for the workers (None: nothing to do)."""
        return None

    def load_failed(self, request: Any) -> None:
        """The tokens this connector provided `request` failed to load; it computes them
        itself now (kv_load_failure_policy "recompute"): offer it nothing again."""

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        """(keep its blocks until a transfer is done, kv_transfer_params for the
        response)."""
        return False, None

    # --------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: list[Any], block_dim: int) -> None:
        """The KV cache tensor of every layer, and the dimension that indexes blocks."""

    def set_row_converter(self, convert: Callable[[Any, Any], Any]) -> None:
        """How to turn cache rows of another KV cache dtype into this cache's
        (`convert(rows, dtype)`: the attention backend's format, given by the worker), for
        a peer whose cache dtype differs."""

    def start_load_kv(self, metadata: Any) -> None:
        """Begin (or do) this step's loads, before the forward."""

    def wait_for_layer_load(self, layer_index: int) -> None:
        """Block until the layer's loads are in (a no-op for whole-block loaders)."""

    def save_kv_layer(self, layer_index: int, metadata: Any) -> None:
        """Start saving the layer's new KV (a no-op for whole-block savers)."""

    def wait_for_save(self, metadata: Any) -> None:
        """Finish this step's saves, after the forward."""

    def take_transfer_counts(self) -> Any:
        """The bytes moved, blocks failed and transfer times since the last call
        (metrics/stats.py KVTransferCounts), or None."""
        return None

    def get_load_failures(self) -> set[str]:
        """Requests whose blocks failed to load since the last call (they fail, as
        kv_load_failure_policy "fail" asks)."""
        return set()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                 set[str] | None]:
        """Requests whose asynchronous sending / receiving finished (a receive that
        failed is reported by `get_load_failures` instead)."""
        return None, None

    def shutdown(self) -> None:
        """Stop the connector's threads and sockets (the engine is shutting down)."""

    def cancel_loads(self, request_ids: set[str]) -> None:
        """These requests ended (their blocks may be someone else's next step): an
        asynchronous load still under way for one of them must not be written."""
