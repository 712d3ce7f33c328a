"""KV cache groups: which layers share one block table, and how far back they attend.

A model whose layers all attend the same way (full attention, or one sliding window) has one
group: one block table per request covers every layer. A hybrid model (Gemma 3: five
sliding-window layers to one global layer) needs tables that grow differently: a sliding
layer drops the blocks that fell out of its window, a global layer keeps them all. As in
vLLM, the layers are split into groups of equal size, each of one attention type, and all
groups draw from one block pool: a block id then names one page in each of `group_size`
per-slot KV tensors, and layer j of any group uses slot j. So a block costs the same bytes
whichever group holds it, and a block freed by a sliding group can serve a global one.
This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """One KV cache group.

    Attributes:
        layer_indices: the model's layers in the group; layer_indices[j] uses KV slot j.
        sliding_window: the layers' window in tokens (a query sees keys at positions
            > its own - window), or None for full attention.
    """

    layer_indices: tuple[int, ...]
    sliding_window: int | None = None


@dataclass(frozen=True)
class KVCacheCapacity:
    """The KV cache the worker made, as the scheduler accounts for it.

    Attributes:
        num_blocks: KV blocks in the pool, including the reserved null block 0.
        num_cpu_blocks: host blocks for swap preemption, including an unused block 0 (fewer
            than 2 make every preemption a recompute; only read in "swap" mode).
        groups: the model's KV cache groups (None: one full-attention group; empty: the
            model keeps no KV cache and serves pooling requests only).
    """

    num_blocks: int
    num_cpu_blocks: int = 0
    groups: tuple[KVCacheGroupSpec, ...] | None = None


def make_kv_cache_groups(
    layer_windows: Sequence[int | None], max_model_len: int
) -> tuple[KVCacheGroupSpec, ...]:
    """Split layers into equal-size groups of one attention type each.

    A window at least `max_model_len` long never hides a key, so such layers count as full
    attention. The group size is the smallest count of layers of one type (vLLM's rule):
    Gemma 3 270M's 15 sliding and 3 global layers make 5 + 1 groups of 3 layers. A type whose
    count is not a multiple of it gets a smaller last group (its unused slots stay idle).
    """
    if not layer_windows:
        raise ValueError("A model needs at least one attention layer for its KV cache.")
    windows = [w if w is not None and w < max_model_len else None for w in layer_windows]
    layers_of: dict[int | None, list[int]] = {}
    for layer_index, window in enumerate(windows):
        layers_of.setdefault(window, []).append(layer_index)
    group_size = min(len(layers) for layers in layers_of.values())
    groups = []
    for window, layers in layers_of.items():
        for start in range(0, len(layers), group_size):
            groups.append(KVCacheGroupSpec(tuple(layers[start : start + group_size]), window))
    return tuple(groups)


def num_kv_slots(groups: Sequence[KVCacheGroupSpec]) -> int:
    """KV tensors the worker allocates: the size of the largest group."""
    return max(len(group.layer_indices) for group in groups)
