"""Choosing a layer's linear method once its weights are loaded: the format it was asked
to run (the model's quantization) and what the checkpoint stored (dense values or group
codes), on what its platform runs.

For a decoder matrix:
- no quantization (or a layer never quantized, such as an MoE router): the dense weight,
  as bfloat16 panels for our C kernel where it is measured at least as fast as torch's
  (bf16_panels.py; on matrix units for small steps, torch's for the large ones beside it),
  else packed where oneDNN's layout pays (`dense_method`);
- on a GPU with Triton: group codes on the Triton kernel, the file's own where it has them;
- where the byte kernels serve (bfloat16 on a CPU with a vector variant): the file's codes
  as W4A8 / W8A8 (or the two of a SplitWeight), else the weight quantized to W4A8 (int4)
  or W8A8 (fp8's grid); beside the dense weight for large steps where dense measured
  faster (matrix units, crossover.py) and `keep_dense`, which runs as an unquantized
  layer's (bf16 panels where they serve, torch's method beyond);
- elsewhere torch's weight-only int4 / int8 for steps of up to 8 tokens, beside the dense
  weight for larger ones unless not `keep_dense`; fp8 there is the dense weight rounded to
  FP8's grid (no kernel reads FP8).
The LM head runs int8 whatever the body runs (the vocabulary projection decides tokens;
GGUF files keep it at 8 bits), with a 4-bit shortlist copy for argmax-only steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from pagedllm.layers.quantization.base import LinearMethod, ReorderedInput
from pagedllm.layers.quantization.bf16_panels import (
    Bf16PanelWeight,
    panel_steps,
    panels_fit,
    panels_serve,
)
from pagedllm.layers.quantization.byte_dot import (
    W4A8Weight,
    can_quantize_w4a8,
    quantize_w4a8,
    quantize_w8a8,
    w4a8_from_codes,
    w8a8_from_codes,
)
from pagedllm.layers.quantization.codes import GroupCodes, fp8_grid
from pagedllm.layers.quantization.crossover import CrossoverMethod, dense_from_tokens
from pagedllm.layers.quantization.dense import DenseMethod, PackedDenseMethod, dense_method
from pagedllm.layers.quantization.triton_groups import (
    quantize_for_triton,
    triton_weight_from_codes,
    uses_triton_weights,
)
from pagedllm.layers.quantization.weight_only import (
    QUANTIZED_MAX_TOKENS,
    quantize,
    quantize_int8,
)


@dataclass(frozen=True)
class WeightPlan:
    """How a model's weights run: its quantization ("int4", "int8", "fp8"; None: dense)
    and whether dense copies stay for the step sizes where they win."""

    quantization: str | None = None
    keep_dense: bool = True


class LoadedLinear(Protocol):
    """What selection needs of a loaded linear layer (layers/linear.py Linear)."""

    weight: nn.Parameter

    def take_file_codes(self, usable: bool) -> GroupCodes | None:
        """The whole weight as file codes when `usable`, else dequantized into `weight`."""

    def release_dense_weight(self) -> None:
        """Free the dense weight (a method that does not read it serves every step)."""


def _dense(layer: LoadedLinear) -> LinearMethod:
    """The layer's torch dense method; a packed copy replaces the plain weight (a layer's
    weight is read by nothing else), so the model is not held twice."""
    method = dense_method(layer.weight)
    if isinstance(method, PackedDenseMethod):
        layer.release_dense_weight()
    return method


def _takes_panels(weight: torch.Tensor) -> bool:
    """Whether a dense `weight` runs as bfloat16 panels on our C kernel (bf16_panels.py):
    a shape the kernel takes, on a CPU where the panels serve."""
    return panels_fit(weight) and panels_serve()


def _unquantized(layer: LoadedLinear, keep_dense: bool = True) -> LinearMethod:
    """A layer that stays dense: bfloat16 panels for our C kernel where they serve
    (bf16_panels.py; they replace the plain weight), beside torch's method for the large
    steps where that wins (matrix units; with `keep_dense` only, else torch's alone), else
    torch's method."""
    if not _takes_panels(layer.weight.data):
        return _dense(layer)
    max_tokens = panel_steps().max_tokens
    if max_tokens is not None and not keep_dense:
        return _dense(layer)
    panels = Bf16PanelWeight.from_weight(layer.weight.data)
    if max_tokens is not None:
        return CrossoverMethod(panels, _dense(layer), max_tokens)
    layer.release_dense_weight()
    return panels


def select_linear_method(
    layer: LoadedLinear, plan: WeightPlan, quantizable: bool = True
) -> LinearMethod:
    """The method `layer` runs with from now on (see the module docstring)."""
    weight = layer.weight
    method = plan.quantization if quantizable else None
    if method is None:
        layer.take_file_codes(usable=False)
        return _unquantized(layer, plan.keep_dense)
    if uses_triton_weights(weight.device):
        return _triton_method(layer, method)
    if method == "fp8":
        # vLLM's dynamic FP8: the weight rounded to float8 e4m3 (one scale per tensor).
        layer.take_file_codes(usable=False)
        with torch.no_grad():
            weight.data.copy_(fp8_grid(weight.data))
        if not can_quantize_w4a8(weight.data):  # no kernel reads FP8: the rounded weight
            return _unquantized(layer, plan.keep_dense)
    codes = layer.take_file_codes(usable=can_quantize_w4a8(weight.data))
    if codes is not None:
        byte_dot = _with_input_order(
            w4a8_from_codes(codes) if codes.is_int4 else w8a8_from_codes(codes), codes
        )
    elif method == "int4" and can_quantize_w4a8(weight.data):
        byte_dot = quantize_w4a8(weight.data)
    elif method == "fp8":
        byte_dot = quantize_w8a8(weight.data)
    else:
        return _weight_only_method(layer, method, plan.keep_dense)
    return _beside_dense_for_large_steps(layer, byte_dot, codes, plan.keep_dense)


def _with_input_order(method: LinearMethod, codes: GroupCodes) -> LinearMethod:
    """`method` reading its input in the codes' order when that is not the layer's."""
    if codes.input_perm is None:
        return method
    return ReorderedInput(method, codes.input_perm.to(codes.codes.device))


def _triton_method(layer: LoadedLinear, method: str) -> LinearMethod:
    """The weight as a TritonGroupWeight (its file codes exactly, else quantized with
    `method`), serving every step; the dense weight is released."""
    weight = layer.weight
    codes = layer.take_file_codes(usable=method != "fp8")
    if codes is not None:
        quantized: LinearMethod = triton_weight_from_codes(codes, weight.device)
        if codes.input_perm is not None:
            quantized = ReorderedInput(quantized, codes.input_perm.to(weight.device))
    else:
        quantized = quantize_for_triton(weight.data, method)
    layer.release_dense_weight()
    return quantized


def _weight_only_method(layer: LoadedLinear, method: str, keep_dense: bool) -> LinearMethod:
    """torch's weight-only `method` for small steps (every step without `keep_dense`);
    shapes its int4 kernel cannot take stay dense."""
    quantized = quantize(layer.weight.data, method)
    if quantized is None:  # dense for every step, as an unquantized layer
        return _unquantized(layer, keep_dense)
    if keep_dense:
        return CrossoverMethod(quantized, _dense(layer), QUANTIZED_MAX_TOKENS)
    layer.release_dense_weight()
    return quantized


def _beside_dense_for_large_steps(
    layer: LoadedLinear, byte_dot: LinearMethod, codes: GroupCodes | None, keep_dense: bool
) -> LinearMethod:
    """The byte kernels alone (the dense weight released), or beside the dense weight for
    the step sizes where dense measured faster on this CPU (matrix units). There the large
    steps run as an unquantized layer's would: bfloat16 panels on our C kernel where they
    serve (so the decode stack keeps such steps in its one call), torch's method beyond."""
    dense_from = dense_from_tokens() if keep_dense else None
    if dense_from is None:
        layer.release_dense_weight()
        return byte_dot
    weight = layer.weight
    if codes is not None:  # the dense weight was never filled from the file
        with torch.no_grad():
            weight.data.copy_(codes.dense(weight.dtype))
    # Panels limited to steps the byte kernels take anyway would never serve: torch's alone.
    panels_limit = panel_steps().max_tokens
    panels_reach = panels_limit is None or panels_limit >= dense_from
    return CrossoverMethod(byte_dot, _unquantized(layer) if panels_reach else _dense(layer),
                           dense_from - 1)


def _shortlist_method(weight: nn.Parameter, codes: GroupCodes | None) -> LinearMethod:
    """The head's 4-bit ranking copy: the file's own 4-bit codes where they are float16-
    scaled (a tied Q4_0 embedding: exact, at Q4_0's 0.5625 bytes a weight), else the dense
    weight requantized in Q4_1's form (0.625 bytes a weight: fewer than Q4_K's codes with
    their float32 sub-block scales, and the shortlist only ranks)."""
    if codes is not None and codes.is_int4 and int(codes.codes.max()) <= 15:
        own = w4a8_from_codes(codes)
        if isinstance(own, W4A8Weight) and own.scales_and_mins.dtype == torch.float16:
            return own
    return quantize_w4a8(weight.data)


def _dense_head(weight: nn.Parameter) -> LinearMethod:
    """An unquantized head's method: bfloat16 panels for our C kernel where they serve (a
    copy beside the dense weight, which the embedding and the refinement read; torch's
    linear on that same weight for the large steps where it wins, so no third copy), else
    torch's dense method on the weight itself."""
    if not _takes_panels(weight.data):
        return dense_method(weight)
    panels = Bf16PanelWeight.from_weight(weight.data)
    max_tokens = panel_steps().max_tokens
    return panels if max_tokens is None else CrossoverMethod(panels, DenseMethod(weight),
                                                            max_tokens)


def select_lm_head_methods(
    weight: nn.Parameter, codes: GroupCodes | None, plan: WeightPlan
) -> tuple[LinearMethod, LinearMethod | None]:
    """(the LM head's method for logits, its 4-bit shortlist method for argmax-only steps
    or None). int8 whatever the body's quantization: GGUF files keep the vocabulary matrix
    at 8 bits (Q8_0), whose own codes are taken exactly. The 4-bit shortlist (a file's own
    4-bit codes where its vocabulary matrix has them) reads half the bytes, but its noise
    over the vocabulary would bias the softmax normaliser (perplexity +4% on natural text,
    measured), so it serves argmax-only steps and only with `keep_dense`. The head keeps
    its dense weight in every case (a tied embedding reads it, and the top candidates are
    refined from it)."""
    if plan.quantization is None:
        return _dense_head(weight), None
    int8_codes = codes if codes is not None and not codes.is_int4 else None
    if uses_triton_weights(weight.device):
        if int8_codes is not None:
            return triton_weight_from_codes(int8_codes, weight.device), None
        return quantize_for_triton(weight.data, "int8"), None
    if not can_quantize_w4a8(weight.data):
        quantized = quantize_int8(weight.data)
        if plan.keep_dense:
            return CrossoverMethod(quantized, dense_method(weight), QUANTIZED_MAX_TOKENS), None
        return quantized, None
    main = w8a8_from_codes(int8_codes) if int8_codes is not None else quantize_w8a8(weight.data)
    if not plan.keep_dense:
        return main, None
    shortlist: LinearMethod = _shortlist_method(weight, codes)
    dense_from = dense_from_tokens()
    if dense_from is None:
        return main, shortlist
    dense = dense_method(weight)  # large steps on the dense copy (AMX), for both
    return (
        CrossoverMethod(main, dense, dense_from - 1),
        CrossoverMethod(shortlist, dense, dense_from - 1),
    )
