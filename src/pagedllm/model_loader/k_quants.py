"""GGUF's Q5_0 and K-quant blocks (Q4_K, Q5_K, Q6_K) as GroupCodes, value for value.

Each format's block is unpacked into the codes and per-group scales (and minimums) that
give back exactly the values llama.cpp defines, so the byte dot-product kernels run the
file's own numbers (layers/quantization.py GroupCodes):

- Q5_0, blocks of 32 (22 bytes): float16 d, 32 high bits, 16 bytes of low nibbles;
  w = d * (q - 16) with q in 0..31: int8 codes q - 16, scale d.
- Q4_K, super-blocks of 256 (144 bytes): float16 d and dmin, twelve bytes packing eight
  6-bit (scale, min) pairs, 128 bytes of nibbles (per 64 values: the low nibbles are the
  first 32, the high ones the next 32); w = d * sc * q - dmin * m, i.e. int4 codes with
  scale d * sc and minimum -dmin * m per 32 (both exact in float32).
- Q5_K, super-blocks of 256 (176 bytes): Q4_K's d, dmin and (scale, min) pairs, then 32
  bytes of fifth bits (bit g of byte l is value l of group g) and 128 bytes of nibbles as
  Q4_K's; w = d * sc * q - dmin * m with q in 0..31: 5-bit codes with Q4_K's scales and
  minimums (run as two int4 weights, quantization.py SplitWeight).
- Q6_K, super-blocks of 256 (210 bytes): 128 bytes of low nibbles, 64 of 2-bit highs, 16
  int8 scales (one per 16 values) and float16 d; w = d * sc * (q - 32): int8 codes q - 32
  with a scale per half-group.

Every function takes one matrix's raw bytes [rows, row_bytes] (uint8) and returns its
GroupCodes [rows, row_values / 32, ...].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from pagedllm.layers.quantization import GroupCodes

_SUPER = 256  # values per K-quant super-block


def float16_at(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as float32."""
    return blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def q5_0_codes(data: np.ndarray) -> GroupCodes:
    """Q5_0 → int8 codes q - 16 and scales d."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, 22)
    d = float16_at(blocks, 0)
    high = blocks[..., 2:6].copy().view(np.uint32)  # [rows, groups, 1]
    bits = (high >> np.arange(32, dtype=np.uint32)) & 1  # [rows, groups, 32]
    packed = blocks[..., 6:]
    low = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # [rows, groups, 32]
    codes = (low | (bits.astype(np.uint8) << 4)).astype(np.int8) - np.int8(16)
    return GroupCodes(torch.from_numpy(codes), torch.from_numpy(d), None)


def _q4_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs of each super-block from its 12 bytes
    [..., 12] → two [..., 8] arrays. Bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3;
    bytes 8-11 hold the low 4 bits of scales (low nibble) and mins (high nibble) 4-7,
    whose top 2 bits are the top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    first, second, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([first & 0x3F, (rest & 0x0F) | ((first >> 6) << 4)], axis=-1)
    mins = np.concatenate([second & 0x3F, (rest >> 4) | ((second >> 6) << 4)], axis=-1)
    return scales, mins


def _k_nibbles(packed: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K's 128 bytes of nibbles per super-block → [rows, supers, 8, 32] in group
    order (per chunk of 64 values: the low nibbles are its first 32, the high ones the
    next 32)."""
    rows = packed.shape[0]
    nibbles = packed.reshape(rows, -1, 4, 32)
    return np.stack([nibbles & 0x0F, nibbles >> 4], axis=3).reshape(rows, -1, 8, 32)


def _with_k_scales(blocks: np.ndarray, codes: np.ndarray) -> GroupCodes:
    """GroupCodes of `codes` [rows, supers, 8, 32] with the scales d * sc and minimums
    -dmin * m that Q4_K and Q5_K blocks start with (d, dmin, then 12 packed bytes)."""
    rows = blocks.shape[0]
    d, dmin = float16_at(blocks, 0)[..., None], float16_at(blocks, 2)[..., None]
    sc, m = _q4_k_scales(blocks[..., 4:16])
    scales = (d * sc.astype(np.float32)).reshape(rows, -1)
    mins = (-(dmin * m.astype(np.float32))).reshape(rows, -1)
    return GroupCodes(
        torch.from_numpy(codes.reshape(rows, -1, 32).copy()), torch.from_numpy(scales),
        torch.from_numpy(mins),
    )  # fmt: skip


def q4_k_codes(data: np.ndarray) -> GroupCodes:
    """Q4_K → int4 codes, scales d * sc and minimums -dmin * m per group of 32."""
    blocks = data.reshape(data.shape[0], -1, 144)  # [rows, supers, 144]
    return _with_k_scales(blocks, _k_nibbles(blocks[..., 16:]))


def q5_k_codes(data: np.ndarray) -> GroupCodes:
    """Q5_K → 5-bit codes (0..31), scales d * sc and minimums -dmin * m per group of 32."""
    blocks = data.reshape(data.shape[0], -1, 176)  # [rows, supers, 176]
    fifth_bits = blocks[..., 16:48]  # [rows, supers, 32]: bit g of byte l is value l of group g
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    high = (fifth_bits[:, :, None, :] >> shifts) & 1  # [rows, supers, 8 groups, 32]
    return _with_k_scales(blocks, _k_nibbles(blocks[..., 48:]) | (high << 4))


def q6_k_codes(data: np.ndarray) -> GroupCodes:
    """Q6_K → int8 codes q - 32, with scales d * sc per half-group of 16."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, 210)
    low = blocks[..., :128].reshape(rows, -1, 2, 2, 32)  # [.., half, ql part, 32]
    high = blocks[..., 128:192].reshape(rows, -1, 2, 1, 32)  # [.., half, 1, 32]
    sc = blocks[..., 192:208].copy().view(np.int8).astype(np.float32)  # [rows, supers, 16]
    d = float16_at(blocks, 208)[..., None]
    # Per 128-value half: values 32j..32j+31 (j = 0..3) take the low or high nibbles of ql
    # part j % 2 and bits 2j..2j+1 of qh.
    nibbles = np.stack([low & 0x0F, low >> 4], axis=3)  # [.., half, 2 (nibble), 2 (part), 32]
    nibbles = nibbles.reshape(rows, -1, 2, 4, 32)  # j = 2 * nibble + part
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    twos = (high >> shifts) & 0x03  # [.., half, 4, 32]
    codes = (nibbles | (twos << 4)).astype(np.int8) - np.int8(32)
    scales = (d * sc).reshape(rows, -1, 2)  # [rows, groups, 2]: 16 values per scale
    return GroupCodes(
        torch.from_numpy(codes.reshape(rows, -1, 32).copy()), torch.from_numpy(scales), None
    )


K_QUANT_DECODERS: dict[str, Callable[[np.ndarray], GroupCodes]] = {
    "Q5_0": q5_0_codes,
    "Q4_K": q4_k_codes,
    "Q5_K": q5_k_codes,
    "Q6_K": q6_k_codes,
}
