"""The one forward context: attention metadata and KV caches of the step being run.

Models take explicit `(input_ids, positions)`; attention layers read everything else from
this context. It is set with a context manager that forbids nesting, so no stale metadata
can leak into a later step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from pagedllm.attention.backend import AttentionBackend


@dataclass
class ForwardContext:
    """What attention layers need during one forward pass.

    Attributes:
        backend: the active attention backend.
        attn_metadata: the backend's metadata for this step (of KV cache group 0).
        kv_caches: one KV cache tensor per layer, indexed by layer index.
        layer_metadata: with several KV cache groups (block tables per group), the metadata
            of each layer's group, indexed by layer index; None when one group serves all.
    """

    backend: AttentionBackend
    attn_metadata: Any
    kv_caches: list[torch.Tensor]
    layer_metadata: list[Any] | None = None

    def metadata_for(self, layer_idx: int) -> Any:
        """The attention metadata layer `layer_idx` reads."""
        if self.layer_metadata is None:
            return self.attn_metadata
        return self.layer_metadata[layer_idx]


_current: ForwardContext | None = None


@contextmanager
def set_forward_context(context: ForwardContext) -> Iterator[None]:
    """Make `context` current for the duration of one forward pass."""
    global _current
    if _current is not None:
        raise RuntimeError("set_forward_context cannot be nested.")
    _current = context
    try:
        yield
    finally:
        _current = None


def get_forward_context() -> ForwardContext:
    """The context of the forward pass being run."""
    if _current is None:
        raise RuntimeError("No forward context is set: run the model inside set_forward_context.")
    return _current
