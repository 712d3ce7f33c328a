"""A quantized checkpoint's `quantization_config`: which format, which weight method it
runs as, and how its tensors become the layers' weights (gptq.py, compressed_tensors.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pagedllm.layers.quantization import GroupCodes
from pagedllm.model_loader.compressed_tensors import (
    CompressedTensorsConfig,
    iterate_compressed_weights,
)
from pagedllm.model_loader.gptq import W4A16Config, iterate_w4a16_weights

# vLLM's names for the formats, as `quant_method` spells them.
METHODS = ("gptq", "awq", "compressed-tensors")


def parse(config: dict[str, Any]) -> W4A16Config | CompressedTensorsConfig:
    """The checked scheme of a quantization_config.

    Raises:
        ValueError: an unknown quant_method, or a scheme that is not built (naming it).
    """
    method = str(config.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return CompressedTensorsConfig.parse(config)
    if method in ("gptq", "awq"):
        return W4A16Config.parse(config)
    raise ValueError(
        f"The checkpoint's quantization_config quant_method {method!r} is not built "
        f"(built: {', '.join(METHODS)})."
    )


def kernel_method(config: dict[str, Any]) -> str | None:
    """The engine's weight method for the checkpoint's codes ("int4", "int8"; None: the
    layers are dequantized, as FP8's)."""
    return parse(config).kernel_method


def iterate_weights(
    config: dict[str, Any],
    weights: Iterable[tuple[str, torch.Tensor]],
    keep_codes: bool,
    dtype: torch.dtype | None,
) -> Iterator[tuple[str, torch.Tensor | GroupCodes]]:
    """The checkpoint's tensors as the layers load them (codes kept when `keep_codes`)."""
    scheme = parse(config)
    if isinstance(scheme, CompressedTensorsConfig):
        return iterate_compressed_weights(weights, scheme, keep_codes, dtype)
    return iterate_w4a16_weights(weights, scheme, keep_codes, dtype)
