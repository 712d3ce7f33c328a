"""PooledData: one pooling request's result as plain data, for the trip to the frontend.

Float32 values, row-major, of `shape`: the runner writes it (model_pooler.to_pooled_data),
msgpack carries it between processes, the frontend views it as a tensor.
"""

from __future__ import annotations

import msgspec


class PooledData(msgspec.Struct, array_like=True, gc=False):
    """A pooled output: float32 values of `shape`, row-major."""

    shape: list[int]
    data: bytes
