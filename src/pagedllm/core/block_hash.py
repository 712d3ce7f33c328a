"""Chained block hashes: the identity of a full KV block for automatic prefix caching.

A block's KV depends on every token before it, so its hash chains its parent block's hash,
its own token ids and any extra keys that change the KV (a LoRA id or cache salt later).
The digest is SHA-256 over a stable byte encoding, so equal hashes mean equal prefixes for
all practical purposes (a collision is as unlikely as breaking SHA-256) and no token ids
need to be stored for a collision check. The chain starts at `NONE_HASH`, a fixed seed.
Only full blocks are hashed. This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedllm.request import Request

# A block hash: a 32-byte SHA-256 digest (bytes hash fast and compare exactly in dicts).
BlockHash = bytes
ExtraKeys = tuple[int | str, ...]

# Root of every chain: the "parent" of a request's first block.
NONE_HASH: BlockHash = hashlib.sha256(b"pagedllm/prefix-cache/none-hash/v1").digest()


def hash_block_tokens(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: ExtraKeys | None = None,
) -> BlockHash:
    """The hash of one full block.

    Args:
        parent_hash: hash of the previous block of the same sequence; None for the first
            block (NONE_HASH is used).
        token_ids: the block's token ids.
        extra_keys: anything else the block's KV depends on (None when nothing).
    """
    digest = hashlib.sha256(parent_hash if parent_hash is not None else NONE_HASH)
    # Token ids as little-endian int64: a fixed-width encoding, so no two token lists share
    # bytes; the count is included so the extra keys cannot be read as tokens.
    digest.update(struct.pack(f"<q{len(token_ids)}q", len(token_ids), *token_ids))
    if extra_keys:
        digest.update(repr(extra_keys).encode())
    return digest.digest()


def update_request_block_hashes(
    request: Request, block_size: int, extra_keys: ExtraKeys | None = None
) -> list[BlockHash]:
    """Hash every full block of `request`'s tokens not yet hashed; return all its hashes.

    Hashes accumulate in `request.block_hashes` (block i covers tokens
    [i * block_size, (i + 1) * block_size)), so each block is hashed once per request even
    as output tokens fill new blocks.
    """
    hashes = request.block_hashes
    token_ids = request.all_token_ids
    if extra_keys is None and request.lora_request is not None:
        # A LoRA adapter changes every layer's K/V: the same tokens under two adapters (or
        # none) never share a block.
        extra_keys = ("lora", request.lora_request.lora_int_id)
    num_full_blocks = len(token_ids) // block_size
    parent = hashes[-1] if hashes else None
    for index in range(len(hashes), num_full_blocks):
        start = index * block_size
        keys = extra_keys
        if index == 0 and request.cache_salt is not None:
            # The first block carries the salt; every later hash chains from it, so
            # requests with different salts (or none) share no block.
            keys = (*(keys or ()), "salt", request.cache_salt)
        if request.mm_features:
            keys = _with_mm_keys(request, start, start + block_size, keys)
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], keys)
        hashes.append(parent)
    return hashes


def _with_mm_keys(
    request: Request, start: int, end: int, extra_keys: ExtraKeys | None
) -> ExtraKeys | None:
    """`extra_keys` plus the identity and offset of every image / video whose placeholder
    tokens overlap the block [start, end): the same placeholder tokens stand for any image,
    so the same text with another image must not share KV (the same image must)."""
    keys: list[int | str] = list(extra_keys or ())
    for feature in request.mm_features:
        if feature.offset < end and feature.end > start:
            keys += ["mm", feature.identifier, feature.offset - start]
    return tuple(keys) or None


def is_plain_hash(key: BlockHash) -> bool:
    """True for a prefix-cache key of group 0 (a plain block hash, no group id appended)."""
    return len(key) == len(NONE_HASH)


def hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHash:
    """The prefix-cache key of a block of KV cache group `group_id`.

    Groups hold different layers' KV for the same tokens, so their blocks must never be
    confused. Group 0 (the only one of most models) keys by the plain hash; the others
    append their id.
    """
    if group_id == 0:
        return block_hash
    return block_hash + group_id.to_bytes(4, "little")
