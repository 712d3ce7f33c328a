"""The identity of a processed multimodal item: what its encoder output is cached under."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pagedllm.multimodal.inputs import TensorData


def hash_item(
    modality: str, data: Mapping[str, TensorData], processor_kwargs: Mapping[str, Any] | None
) -> str:
    """SHA-256 of the item's encoder inputs (names, dtypes, shapes, bytes) and the
    processor options that made them: equal hashes, equal encoder outputs."""
    digest = hashlib.sha256(modality.encode())
    digest.update(_kwargs_bytes(processor_kwargs))
    for name in sorted(data):
        tensor = data[name]
        digest.update(f"|{name}|{tensor.dtype}|{tensor.shape}|".encode())
        digest.update(tensor.data)
    return digest.hexdigest()


def hash_uuid(modality: str, uuid: str, processor_kwargs: Mapping[str, Any] | None) -> str:
    """The identity of an item the caller named (`multi_modal_uuids`): its uuid, made
    distinct per modality and processor options (the same image processed otherwise is
    another encoder output)."""
    if not processor_kwargs:
        return f"{modality}:{uuid}"
    digest = hashlib.sha256(f"{modality}:{uuid}".encode())
    digest.update(_kwargs_bytes(processor_kwargs))
    return f"{modality}:{uuid}:{digest.hexdigest()[:16]}"


def _kwargs_bytes(processor_kwargs: Mapping[str, Any] | None) -> bytes:
    return json.dumps(processor_kwargs or {}, sort_keys=True, default=repr).encode()
