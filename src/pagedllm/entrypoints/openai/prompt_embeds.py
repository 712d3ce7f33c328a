"""The wire form of `prompt_embeds` (vLLM's): base64 of a `torch.save`d tensor, read back
with `torch.load(weights_only=True)` (tensors only: no code runs while loading)."""

from __future__ import annotations

import base64
import binascii
import io

import torch


def decode_prompt_embeds(encoded: str) -> torch.Tensor:
    """The tensor a base64 `prompt_embeds` string holds (ValueError naming the field)."""
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("prompt_embeds must be base64 of torch.save(tensor).") from None
    try:
        tensor = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - any unreadable payload is the client's
        raise ValueError(f"prompt_embeds is not a saved tensor: {error}") from None
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"prompt_embeds must hold one tensor, got {type(tensor).__name__}.")
    return tensor
