"""GPTQ (4 and 8 bits) and AWQ (4 bits) checkpoints: `quantization_config` and the packed
tensors.

A quantized linear layer `X` is stored as `X.qweight`, `X.qzeros`, `X.scales` (and GPTQ's
`X.g_idx`) instead of `X.weight`. Both formats quantize groups of `group_size` inputs of
an output row: w = scale * (q - z), q and z in 0..15, one (scale, z) per group and output.

- GPTQ: qweight int32 [in / 8, out], eight inputs per word (input k at bits 4 (k % 8));
  qzeros int32 [groups, out / 8], eight outputs per word; the classic format stores z - 1
  (`checkpoint_format` "gptq"), "gptq_v2" stores z; g_idx [in] is each input's group.
- AWQ (GEMM): qweight int32 [in, out / 8] and qzeros [groups, out / 8], eight outputs per
  word in the order 0, 2, 4, 6, 1, 3, 5, 7 (nibble i holds output 8c + that order's i-th).

The engine's int4 groups hold 32 inputs with w = d * q + m (GroupCodes), so a group of a
multiple of 32 inputs is exactly d = scale, m = -scale * z on each of its 32-input pieces:
the layers receive the checkpoint's own codes, repacked, never a dense copy. Symmetric
8-bit GPTQ (z = 128) is the int8 kernel's form: codes q - 128, d = scale. GPTQ's
act-order (desc_act) groups gather inputs from anywhere: the codes are lined up by group
and carry the input order the layer then reads its input in (GroupCodes.input_perm).
Without the int4 kernels (float32, no C compiler) the weights are dequantized instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pagedllm.layers.quantization import INT4_GROUP_SIZE, GroupCodes

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_PARTS = ("qweight", "qzeros", "scales", "g_idx")


@dataclass(frozen=True)
class W4A16Config:
    """A checkpoint's `quantization_config` for GPTQ (4 or 8 bits) or AWQ (4 bits)."""

    method: str  # "gptq" or "awq"
    group_size: int  # -1: one group over all inputs
    desc_act: bool = False
    zeros_offset: int = 1  # GPTQ's classic format stores z - 1
    bits: int = 4  # GPTQ also 8

    @property
    def kernel_method(self) -> str:
        """The engine's weight method for these codes."""
        return "int8" if self.bits == 8 else "int4"

    @classmethod
    def parse(cls, config: dict[str, Any]) -> W4A16Config:
        """Check a quantization_config dict.

        Raises:
            ValueError: naming the field that asks for what is not built.
        """
        method = str(config.get("quant_method", "")).lower()
        if method not in ("gptq", "awq"):
            raise ValueError(f"quantization_config quant_method {method!r} is not gptq or awq.")
        bits = int(config.get("bits", config.get("w_bit", 4)))
        if bits not in ((4, 8) if method == "gptq" else (4,)):
            built = "4- and 8-bit gptq" if method == "gptq" else "4-bit awq"
            raise ValueError(
                f"quantization_config bits={bits} ({method}): only {built} is built."
            )
        if bits == 8 and not config.get("sym", True):
            raise ValueError(
                "quantization_config bits=8 with sym=false (gptq): asymmetric 8-bit codes are "
                "not built (the int8 kernel has no per-group zero point)."
            )
        group_size = int(config.get("group_size", config.get("q_group_size", 128)))
        if group_size != -1 and (group_size <= 0 or group_size % INT4_GROUP_SIZE):
            raise ValueError(
                f"quantization_config group_size={group_size} ({method}): groups of a "
                f"multiple of {INT4_GROUP_SIZE} inputs (or -1) are built."
            )
        if method == "awq":
            version = str(config.get("version", "gemm")).lower()
            if version != "gemm":
                raise ValueError(
                    f"quantization_config version={version!r} (awq): the GEMM packing is built."
                )
            if not config.get("zero_point", True):
                raise ValueError("quantization_config zero_point=false (awq) is not built.")
            return cls("awq", group_size, zeros_offset=0)
        fmt = str(config.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"quantization_config checkpoint_format={fmt!r} (gptq) is not built.")
        return cls("gptq", group_size, bool(config.get("desc_act", False)),
                   zeros_offset=1 if fmt == "gptq" else 0, bits=bits)


def unpack_rows(packed: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int32 [r, c] holding 32 / bits values per word along the rows → [32 / bits * r, c]
    (unsigned codes)."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = (packed.unsqueeze(1) >> shifts.view(1, per_word, 1)) & ((1 << bits) - 1)
    return values.reshape(-1, packed.shape[1]).to(torch.uint8)


def unpack_columns(
    packed: torch.Tensor, order: tuple[int, ...] | None = None, bits: int = 4
) -> torch.Tensor:
    """int32 [r, c] holding 32 / bits values per word along the columns → [r, 32 / bits * c];
    with `order`, value i of word j is column 8 j + order[i] (AWQ's 4-bit order)."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    nibbles = (packed.unsqueeze(2) >> shifts.view(1, 1, per_word)) & ((1 << bits) - 1)
    if order is not None:
        placed = torch.empty_like(nibbles)
        placed[:, :, list(order)] = nibbles
        nibbles = placed
    return nibbles.reshape(packed.shape[0], -1).to(torch.uint8)


def layer_codes(
    config: W4A16Config, parts: dict[str, torch.Tensor], name: str
) -> GroupCodes:
    """One layer's packed tensors → GroupCodes (codes [out, in / 32, 32], d, m).

    Raises:
        ValueError: when the tensors' shapes disagree, or act-order groups do not follow
            the inputs' order (not built).
    """
    if config.method == "gptq":
        q = unpack_rows(parts["qweight"], config.bits).T  # [out, in]
        zeros = unpack_columns(parts["qzeros"], bits=config.bits)  # [groups, out]
    else:
        q = unpack_columns(parts["qweight"], AWQ_ORDER).T
        zeros = unpack_columns(parts["qzeros"], AWQ_ORDER)
    out_size, in_size = q.shape
    scales = parts["scales"].float()  # [groups, out]
    group_size = in_size if config.group_size == -1 else config.group_size
    num_groups = -(-in_size // group_size)
    if scales.shape != (num_groups, out_size) or zeros.shape[0] != num_groups:
        raise ValueError(
            f"{name}: scales {tuple(scales.shape)} / qzeros do not fit a [{out_size}, "
            f"{in_size}] weight in groups of {group_size}."
        )
    if in_size % INT4_GROUP_SIZE:
        raise ValueError(f"{name}: {in_size} inputs are not whole groups of {INT4_GROUP_SIZE}.")
    input_perm = _act_order(parts.get("g_idx"), in_size, group_size, num_groups, name)
    if input_perm is not None:  # each group's inputs side by side, in g_idx's order
        q = q[:, input_perm]
    z = zeros[:, :out_size].float() + config.zeros_offset  # [groups, out]
    pieces = in_size // INT4_GROUP_SIZE
    parent = torch.arange(pieces) * INT4_GROUP_SIZE // group_size  # piece → its group
    d = scales[parent].T.contiguous()  # [out, pieces]
    if config.bits == 8:  # symmetric: w = scale * (q - 128), int8 codes q - 128
        if not bool((z == 128).all()):
            raise ValueError(f"{name}: 8-bit zero points other than 128 are not built.")
        signed = (q.to(torch.int16) - 128).to(torch.int8).contiguous()
        return GroupCodes(signed.view(out_size, pieces, INT4_GROUP_SIZE), d, None, input_perm)
    m = (-scales * z)[parent].T.contiguous()
    codes = q.contiguous().view(out_size, pieces, INT4_GROUP_SIZE)
    return GroupCodes(codes, d, m, input_perm)


def _act_order(
    g_idx: torch.Tensor | None, in_size: int, group_size: int, num_groups: int, name: str
) -> torch.Tensor | None:
    """The input order that makes g_idx's groups contiguous (None: already in order).

    GPTQ's act-order quantizes inputs by decreasing activation energy, so group g holds
    inputs from anywhere; sorting the inputs by g_idx (stably) lines each group up, and
    the layer then reads its input in that order.

    Raises:
        ValueError: when a group does not hold exactly `group_size` inputs.
    """
    if g_idx is None:
        return None
    groups = g_idx.long()
    if torch.equal(groups, torch.arange(in_size, dtype=torch.int64) // group_size):
        return None
    counts = torch.bincount(groups, minlength=num_groups)
    if groups.min() < 0 or counts.shape[0] != num_groups or bool((counts != group_size).any()):
        raise ValueError(
            f"{name}: g_idx does not give every group {group_size} inputs; not a GPTQ "
            "act-order layout."
        )
    return torch.argsort(groups, stable=True)


def iterate_w4a16_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    config: W4A16Config,
    keep_codes: bool,
    dtype: torch.dtype | None,
) -> Iterator[tuple[str, torch.Tensor | GroupCodes]]:
    """The checkpoint's tensors (read as stored) with each quantized layer's parts joined
    into its `X.weight`: GroupCodes when `keep_codes`, else the dequantized weight in
    `dtype`; the other floating tensors cast to `dtype`."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    needed = {"qweight", "qzeros", "scales"}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part not in _PARTS:
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        # GPTQ layers may carry g_idx; it comes in the same file, so wait for it there.
        if needed <= set(parts) and (config.method == "awq" or "g_idx" in parts):
            yield from _joined(prefix, pending.pop(prefix), config, keep_codes, dtype)
    for prefix, parts in pending.items():
        if not needed <= set(parts):
            missing = sorted(needed - set(parts))
            raise ValueError(f"Quantized layer {prefix!r} has no {', '.join(missing)}.")
        yield from _joined(prefix, parts, config, keep_codes, dtype)


def _joined(
    prefix: str, parts: dict[str, torch.Tensor], config: W4A16Config, keep_codes: bool,
    dtype: torch.dtype | None,
) -> Iterator[tuple[str, torch.Tensor | GroupCodes]]:
    codes = layer_codes(config, parts, prefix)
    yield f"{prefix}.weight", codes if keep_codes else codes.dense(dtype or torch.float32)
