"""KV cache events (vLLM's `KVEventBatch`): what a prefix-aware router needs to know of an
engine's prefix cache — blocks stored, blocks removed, everything cleared.

The block pool records an event whenever a full block of KV cache group 0 becomes findable
by its hash (`BlockStored`, with the tokens it holds), stops being findable because its
memory is reused (`BlockRemoved`), or the whole cache is reset (`AllBlocksCleared`). The
engine core takes the events after each schedule and publishes them
(engine/kv_events_publisher.py). Records encode as vLLM's do: msgspec arrays, each event
tagged with its class name. Hashes are the engine's own (32-byte SHA-256 chains,
core/block_hash.py). Plain data: no torch, nothing of the engine.
"""

from __future__ import annotations

from typing import Any

import msgspec

# The tier a block lives in, as vLLM names its KV cache tier (whatever the device).
MEDIUM_GPU = "GPU"


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the events (encoded as `["ClassName", field, ...]`)."""


class BlockStored(KVCacheEvent):
    """Full blocks became findable: their hashes (a chain), the parent of the first (None:
    the first block of a sequence), their tokens (block_size per block)."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks stopped being findable (their memory went to other tokens)."""

    block_hashes: list[bytes]
    medium: str | None = MEDIUM_GPU


class AllBlocksCleared(KVCacheEvent):
    """The prefix cache was reset."""


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One step's events: `[ts, events, data_parallel_rank]`."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class KVEventRecorder:
    """Collects events between two `take` calls (the block pool writes, the core reads)."""

    def __init__(self) -> None:
        self._events: list[Any] = []

    def record(self, event: KVCacheEvent) -> None:
        """Add one event."""
        self._events.append(event)

    def take(self) -> list[Any]:
        """The events since the last call, oldest first."""
        events, self._events = self._events, []
        return events
