"""compressed-tensors checkpoints (llm-compressor's format): W4A16, W8A8 int8, FP8.

`quantization_config` has `quant_method: compressed-tensors`, a `format` and
`config_groups` whose `weights` arguments say how the Linear layers' weights are stored:

- `pack-quantized`, 4-bit int, groups (a multiple of 32) or channels: `X.weight_packed`
  int32 [out, in / 8] holding q + 8 (q in -8..7) eight inputs a word, `X.weight_scale`
  [out, groups] and, when asymmetric, `X.weight_zero_point` packed the same way along the
  rows [out / 8, groups]. w = scale * (q - zero): the engine's int4 groups exactly
  (d = scale, m = -scale * (8 + zero) on each 32-input piece), run on W4A8.
- `int-quantized`, 8-bit symmetric int per channel (activations dynamic per token):
  `X.weight` int8 [out, in], `X.weight_scale` [out, 1]: the W8A8 kernel's int8 groups
  exactly (each group takes its row's scale); activations are quantized per 16 values
  rather than per token (finer).
- `float-quantized`, FP8 e4m3 per tensor or per channel: `X.weight` float8 with
  `X.weight_scale`. No CPU kernel reads FP8, and int8 groups cannot hold its grid (fine
  near zero, coarse near the top): re-quantized to them the default model's agreement with
  the dequantized float32 fell to 96.3% / 95.7% (BENCHMARKS.md), so the weights run
  dequantized in the model's dtype (exact in bfloat16: FP8's 3 mantissa bits times a scale),
  activations unquantized (static `X.input_scale` is not used). The error against the
  format's definition is measured (tests/model_loader/test_compressed_tensors.py).

Anything else (other bit widths, block or tensor-group strategies, act-order, sparsity,
KV cache schemes, several schemes in one checkpoint) is refused with a ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pagedllm.layers.quantization import INT4_GROUP_SIZE, GroupCodes
from pagedllm.model_loader.gptq import unpack_columns

FORMATS = ("pack-quantized", "int-quantized", "float-quantized")
# Tensors of a quantized layer besides its weight.
_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
          "input_scale", "weight_global_scale")


@dataclass(frozen=True)
class CompressedTensorsConfig:
    """The one weight scheme of a compressed-tensors checkpoint."""

    format: str
    num_bits: int
    strategy: str  # "group", "channel" or "tensor"
    group_size: int | None
    symmetric: bool

    @property
    def kernel_method(self) -> str | None:
        """The engine's weight method for these weights: "int4" for 4-bit codes, "int8"
        for int8 codes, None for FP8 (dequantized: see the module docstring)."""
        return {"pack-quantized": "int4", "int-quantized": "int8"}.get(self.format)

    @classmethod
    def parse(cls, config: dict[str, Any]) -> CompressedTensorsConfig:
        """Check a compressed-tensors quantization_config.

        Raises:
            ValueError: naming the field that asks for what is not built.
        """
        where = "quantization_config (compressed-tensors)"
        if config.get("sparsity_config"):
            raise ValueError(f"{where} has a sparsity_config: sparse weights are not built.")
        if config.get("kv_cache_scheme"):
            raise ValueError(f"{where} has a kv_cache_scheme: quantized KV scales are not built.")
        groups = list((config.get("config_groups") or {}).values())
        if len(groups) != 1:
            raise ValueError(f"{where} has {len(groups)} config_groups; one scheme is built.")
        group = groups[0]
        fmt = str(group.get("format") or config.get("format") or "")
        if fmt not in FORMATS:
            raise ValueError(f"{where} format {fmt!r} is not built (built: {', '.join(FORMATS)}).")
        weights = group.get("weights") or {}
        bits, kind = int(weights.get("num_bits", 0)), str(weights.get("type", "int"))
        strategy = str(weights.get("strategy", "tensor"))
        group_size = weights.get("group_size")
        symmetric = bool(weights.get("symmetric", True))
        if weights.get("actorder"):
            raise ValueError(f"{where} weights actorder={weights['actorder']!r} is not built.")
        expected = {"pack-quantized": ("int", 4), "int-quantized": ("int", 8),
                    "float-quantized": ("float", 8)}[fmt]
        if (kind, bits) != expected:
            raise ValueError(
                f"{where} format {fmt!r} with {bits}-bit {kind} weights is not built "
                f"({expected[1]}-bit {expected[0]} is)."
            )
        allowed = {"pack-quantized": ("group", "channel"), "int-quantized": ("channel",),
                   "float-quantized": ("tensor", "channel")}[fmt]
        if strategy not in allowed:
            raise ValueError(
                f"{where} weights strategy {strategy!r} ({fmt}) is not built "
                f"({', '.join(allowed)} are)."
            )
        if strategy == "group" and (not group_size or int(group_size) % INT4_GROUP_SIZE):
            raise ValueError(
                f"{where} group_size={group_size}: groups of a multiple of {INT4_GROUP_SIZE} "
                "inputs are built."
            )
        if not symmetric and fmt != "pack-quantized":
            raise ValueError(f"{where} asymmetric {fmt} weights are not built.")
        activations = group.get("input_activations")
        if fmt == "int-quantized" and activations and not activations.get("dynamic", False):
            raise ValueError(
                f"{where} int8 activations with static input scales are not built (dynamic "
                "per-token activations are)."
            )
        return cls(fmt, bits, strategy, int(group_size) if group_size else None, symmetric)


def iterate_compressed_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    config: CompressedTensorsConfig,
    keep_codes: bool,
    dtype: torch.dtype | None,
) -> Iterator[tuple[str, torch.Tensor | GroupCodes]]:
    """The checkpoint's tensors (read as stored) with each quantized layer joined into its
    `X.weight`: GroupCodes when `keep_codes` (int formats), else the dequantized weight in
    `dtype`; other floating tensors cast to `dtype`."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part in _PARTS or (part == "weight" and not tensor.is_floating_point()) or (
            part == "weight" and tensor.dtype == torch.float8_e4m3fn
        ):
            pending.setdefault(prefix, {})[part] = tensor
            continue
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        yield name, tensor
    for prefix, parts in pending.items():
        codes_or_dense = _layer_weight(config, parts, prefix)
        if isinstance(codes_or_dense, GroupCodes) and not keep_codes:
            codes_or_dense = codes_or_dense.dense(dtype or torch.float32)
        elif isinstance(codes_or_dense, torch.Tensor) and dtype is not None:
            codes_or_dense = codes_or_dense.to(dtype)
        yield f"{prefix}.weight", codes_or_dense


def _layer_weight(
    config: CompressedTensorsConfig, parts: dict[str, torch.Tensor], name: str
) -> GroupCodes | torch.Tensor:
    """One layer's stored tensors → GroupCodes (int formats) or a float32 weight (FP8)."""
    if "weight_scale" not in parts:
        raise ValueError(f"Quantized layer {name!r} has no weight_scale.")
    scale = parts["weight_scale"].float()
    if config.format == "float-quantized":
        weight = parts["weight"].float()
        return weight * (scale if scale.dim() == 2 else scale.reshape(-1)[0])
    return _int_codes(config, parts, scale, name)


def _int_codes(
    config: CompressedTensorsConfig, parts: dict[str, torch.Tensor], scale: torch.Tensor,
    name: str,
) -> GroupCodes:
    if config.format == "int-quantized":
        weight = parts["weight"]
        rows, cols = weight.shape
        if cols % INT4_GROUP_SIZE:
            raise ValueError(f"{name}: {cols} inputs are not whole groups of {INT4_GROUP_SIZE}.")
        groups = cols // INT4_GROUP_SIZE
        codes = weight.to(torch.int8).reshape(rows, groups, INT4_GROUP_SIZE)
        return GroupCodes(codes, scale.reshape(rows, 1).expand(rows, groups).contiguous(), None)
    return _int4_codes(config, parts, scale, name)


def _int4_codes(
    config: CompressedTensorsConfig, parts: dict[str, torch.Tensor], scale: torch.Tensor,
    name: str,
) -> GroupCodes:
    if "weight_packed" not in parts:
        raise ValueError(f"Quantized layer {name!r} has no weight_packed.")
    out_size, in_size = (int(v) for v in parts["weight_shape"].tolist())
    codes = unpack_columns(parts["weight_packed"])[:, :in_size]  # q + 8, in 0..15
    if in_size % INT4_GROUP_SIZE:
        raise ValueError(f"{name}: {in_size} inputs are not whole groups of {INT4_GROUP_SIZE}.")
    group_size = in_size if config.strategy == "channel" else int(config.group_size or 0)
    num_groups = in_size // group_size
    if scale.shape != (out_size, num_groups):
        raise ValueError(
            f"{name}: weight_scale {tuple(scale.shape)} does not fit [{out_size}, {in_size}] "
            f"in groups of {group_size}."
        )
    zero = torch.zeros_like(scale)
    if not config.symmetric:
        packed = parts.get("weight_zero_point")
        if packed is None:
            raise ValueError(f"Quantized layer {name!r} is asymmetric but has no zero point.")
        zero = unpack_columns(packed.T.contiguous()).T[:out_size].float() - 8  # [out, groups]
    pieces = in_size // INT4_GROUP_SIZE
    parent = torch.arange(pieces) * INT4_GROUP_SIZE // group_size
    d = scale[:, parent].contiguous()
    m = (-scale * (8 + zero))[:, parent].contiguous()
    return GroupCodes(codes.contiguous().view(out_size, pieces, INT4_GROUP_SIZE), d, m)
