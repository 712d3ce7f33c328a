"""Sleep mode on a worker: giving the KV cache's memory back while the engine idles, and
taking it again (vLLM's `sleep` / `wake_up`).

The cache tensors keep their identity (the runner and the attention backends hold them);
only their storage is released (resized to nothing) and re-allocated on waking, so their
contents are gone: the engine resets its prefix cache before sleeping. The null block is
zeroed again on waking (padded reads go to it). Weights are released by dropping the model
(worker.py reloads it from the checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# What wake_up may take back, by vLLM's tag names.
WAKE_UP_TAGS = ("weights", "kv_cache")


@dataclass
class SleepMode:
    """Which parts a worker gave back, and each cache's size to take again."""

    kv_released: bool = False
    weights_released: bool = False
    _nbytes: tuple[int, ...] = ()

    def release_kv_caches(self, caches: list[torch.Tensor]) -> None:
        """Free the caches' memory (the tensors stay, empty)."""
        if self.kv_released:
            return
        self._nbytes = tuple(cache.untyped_storage().nbytes() for cache in caches)
        for cache in caches:
            cache.untyped_storage().resize_(0)
        self.kv_released = True

    def restore_kv_caches(self, caches: list[torch.Tensor], block_dim: int,
                          zero_all: bool) -> None:
        """Allocate the caches again (same shapes; contents undefined but the null block,
        or all of it with `zero_all`)."""
        for cache, nbytes in zip(caches, self._nbytes, strict=True):
            cache.untyped_storage().resize_(nbytes)
            if nbytes == 0:
                continue
            if zero_all:
                cache.zero_()
            else:
                cache.select(block_dim, 0).zero_()
        self.kv_released = False
