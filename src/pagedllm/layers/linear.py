"""Linear layers whose parameters know how to load (possibly fused) checkpoint shards.

Each parameter carries a `weight_loader` hook, so a model's `load_weights` is pure data
mapping: HF names in, hook calls out. Fused layers (QKV, gate-up) keep one matmul per step
instead of three or two. Tensor-parallel sharding would be added here; nothing in this file
knows about models, attention or the KV cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers.dense_crossover import dense_from_tokens
from pagedllm.layers.quantization import (
    GroupCodes,
    QuantizedWeight,
    SplitWeight,
    W4A8Weight,
    W8A8Weight,
    can_quantize_w4a8,
    fp8_grid,
    quantize,
    quantize_w4a8,
    quantize_w8a8,
    w4a8_from_codes,
    w8a8_from_codes,
)
from pagedllm.layers.triton_quantization import (
    TritonGroupWeight,
    quantize_for_triton,
    triton_weight_from_codes,
    uses_triton_weights,
)
from pagedllm.platform import get_platform
from pagedllm.utils.math import round_up


def uses_quantized(
    quantized: QuantizedWeight | TritonGroupWeight | None, keeps_dense: bool, num_tokens: int
) -> bool:
    """Whether a step of `num_tokens` rows runs on the quantized copy of a weight: always
    without a dense copy, else for steps of at most the weight's `max_tokens` (None: all)."""
    if quantized is None:
        return False
    limit = quantized.max_tokens
    return not keeps_dense or limit is None or num_tokens <= limit


def can_pack_for_cpu(weight: torch.Tensor) -> bool:
    """True when oneDNN's packed bf16 layout pays for this weight: bfloat16 on a CPU whose
    bf16 matmuls are native (kernels/plan.py; elsewhere oneDNN refuses or emulates it)."""
    return get_platform(weight.device).packs_dense_weights(weight.dtype)


def pack_weight_for_cpu(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked layout of `weight` [out, in]: about 2x faster for small batches.

    The result has the same shape and dtype but a different memory order, so it is only
    valid as the weight argument of `packed_linear`.
    """
    # The batch-size hint only tunes the layout; any batch size works with it.
    return torch.ops.mkldnn._reorder_linear_weight(weight, 64)


def packed_rows(num_rows: int) -> int:
    """The row count a packed matmul of `num_rows` rows runs with (the rest are zero rows).

    oneDNN builds (JIT-compiles) and caches a kernel per input shape: about 3 ms and a few
    hundred KB each. Batch sizes that change every step would rebuild kernels every step,
    and the process grew by every new size seen (+28% resident memory in a 10-minute soak).
    Sizes are exact up to 16, then rounded up to a step of an eighth of the power of two
    below them (at least 16): 55 sizes up to 2048 rows, at most 12.5% extra rows past 128.
    """
    if num_rows <= 16:
        return num_rows
    return round_up(num_rows, max(16, 1 << (num_rows.bit_length() - 4)))


def packed_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ W^T + b with a weight from `pack_weight_for_cpu`; x [rows, ..., in] runs padded
    to `packed_rows(rows)` rows, each row's result the same as in an unpadded batch of that
    many rows."""
    rows = x.shape[0]
    padded = packed_rows(rows)
    if padded != rows:
        x = torch.cat((x, x.new_zeros(padded - rows, *x.shape[1:])))
    out = torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
    return out if padded == rows else out[:rows]


def default_weight_loader(
    param: nn.Parameter, loaded_weight: torch.Tensor | GroupCodes
) -> None:
    """Copy a checkpoint tensor into `param` (same shape; dtype converted). File codes are
    dequantized, and kept on the parameter as `file_codes` for a quantized copy to reuse."""
    if isinstance(loaded_weight, GroupCodes):
        param.file_codes = loaded_weight  # type: ignore[attr-defined]
        loaded_weight = loaded_weight.dense(param.dtype)
    if param.shape != loaded_weight.shape:
        raise ValueError(
            f"Shape mismatch while loading weights: parameter {tuple(param.shape)} "
            f"vs checkpoint {tuple(loaded_weight.shape)}."
        )
    with torch.no_grad():
        param.copy_(loaded_weight)


def _check_shard(param: nn.Parameter, shape: tuple[int, ...], offset: int, size: int) -> None:
    if shape[0] != size or tuple(shape[1:]) != tuple(param.shape[1:]):
        raise ValueError(
            f"Shard shape {tuple(shape)} does not fit rows {offset}:{offset + size} "
            f"of fused parameter {tuple(param.shape)}."
        )


def _same_input_order(perms: list[torch.Tensor | None]) -> bool:
    """True when fused parts read their inputs in one order (so their codes can be joined)."""
    first = perms[0]
    if first is None:
        return all(p is None for p in perms)
    return all(p is not None and torch.equal(p, first) for p in perms)


class Linear(nn.Module):
    """y = x W^T (+ b), with W of shape [output_size, input_size] as in HF checkpoints."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        # LoRA adapter slots (lora/layers.py LoRALinearSlots), attached by the worker when
        # LoRA is enabled; None otherwise. Duck-typed: layers/ does not import lora/.
        self.lora: Any = None
        # Uninitialised: every parameter is filled by load_weights.
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        if bias:
            self.bias: nn.Parameter | None = nn.Parameter(
                torch.empty(output_size), requires_grad=False
            )
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)
        self.packed_weight: torch.Tensor | None = None
        self.quantized: QuantizedWeight | TritonGroupWeight | None = None
        self.keeps_dense = True
        # File codes of the weight's rows, by first row, until quantize() repacks them.
        self.pending_codes: list[tuple[int, GroupCodes]] = []
        # The quantized weight's input order when it is not the layer's (GPTQ act-order):
        # its matmul reads x[:, input_perm]; the dense weight keeps the layer's order.
        self.input_perm: torch.Tensor | None = None

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor | GroupCodes
    ) -> None:
        """Load the whole parameter from one checkpoint tensor."""
        if isinstance(loaded_weight, GroupCodes) and param is self.weight:
            _check_shard(param, loaded_weight.shape, 0, param.shape[0])
            self.pending_codes.append((0, loaded_weight))
            return
        default_weight_loader(param, loaded_weight)

    def load_rows(
        self, param: nn.Parameter, loaded: torch.Tensor | GroupCodes, offset: int, size: int
    ) -> None:
        """Load rows [offset, offset + size) of a fused parameter (a weight's file codes are
        kept for quantize(), which repacks them without a dense copy)."""
        _check_shard(param, tuple(loaded.shape), offset, size)
        if isinstance(loaded, GroupCodes):
            if param is self.weight:
                self.pending_codes.append((offset, loaded))
                return
            loaded = loaded.dense(param.dtype)
        with torch.no_grad():
            param.narrow(0, offset, size).copy_(loaded)

    def _take_file_codes(self, usable: bool) -> GroupCodes | None:
        """The whole weight as file codes, when they are `usable` and its loaded shards were
        all codes of one kind covering every row; else they are dequantized into the dense
        weight (None)."""
        pending, self.pending_codes = sorted(self.pending_codes, key=lambda p: p[0]), []
        starts = [offset for offset, _ in pending]
        ends = [offset + codes.shape[0] for offset, codes in pending]
        if (
            usable
            and pending
            and starts == [0, *ends[:-1]]
            and ends[-1] == self.output_size
            and len({codes.is_int4 for _, codes in pending}) == 1
            and _same_input_order([codes.input_perm for _, codes in pending])
        ):
            parts = [codes for _, codes in pending]
            if any(c.has_half_scales for c in parts):  # Q6_K beside Q8_0 / Q5_0 rows
                parts = [c.with_half_scales() for c in parts]
            mins = [c.mins for c in parts if c.mins is not None]
            return GroupCodes(
                torch.cat([c.codes for c in parts]), torch.cat([c.scales for c in parts]),
                torch.cat(mins) if mins else None, parts[0].input_perm,
            )
        with torch.no_grad():
            for offset, codes in pending:
                rows = self.weight.data.narrow(0, offset, codes.shape[0])
                rows.copy_(codes.dense(self.weight.dtype))
        return None

    def quantize(self, method: str, keep_dense: bool) -> None:
        """Add a weight-only `method` copy ("int8"/"int4") used for small steps.

        With `keep_dense` False the dense weight is released and every step uses the
        quantized one (least memory). Shapes the int4 kernel cannot take stay dense.
        int4 bfloat16 weights on CPU take the W4A8 form instead: the same int4 groups,
        multiplied by int8 activations in our C kernel, faster than the dense matmul at
        every step size on vector units, so the dense weight is released; only on CPUs where
        dense bf16 wins for large steps (matrix units, see dense_crossover.py) does
        `keep_dense` keep it for those steps. A weight loaded as file codes (Q4_0/Q4_1/Q8_0,
        see GroupCodes) becomes W4A8 / W8A8 from those codes exactly. Call before
        `pack_for_cpu`. On a GPU the weight takes the Triton group format instead
        (triton_quantization.py), for every step.
        """
        if uses_triton_weights(self.weight.device):
            self._quantize_for_triton(method)
            return
        if method == "fp8":
            # vLLM's dynamic FP8: the weight rounded to float8 e4m3 (one scale per tensor).
            # No CPU kernel reads FP8: where W8A8 runs it takes the rounded weight as int8
            # groups (one byte a weight, as FP8); elsewhere the rounded weight stays dense.
            self._take_file_codes(usable=False)
            with torch.no_grad():
                self.weight.data.copy_(fp8_grid(self.weight.data))
            if not can_quantize_w4a8(self.weight.data):
                return
        codes = self._take_file_codes(usable=can_quantize_w4a8(self.weight.data))
        byte_dot: W4A8Weight | W8A8Weight | SplitWeight | None = None
        if codes is not None:
            byte_dot = w4a8_from_codes(codes) if codes.is_int4 else w8a8_from_codes(codes)
            self.input_perm = codes.input_perm
        elif method == "int4" and can_quantize_w4a8(self.weight.data):
            byte_dot = quantize_w4a8(self.weight.data)
        elif method == "fp8":
            byte_dot = quantize_w8a8(self.weight.data)
        else:
            self.quantized = quantize(self.weight.data, method)
            if self.quantized is None or keep_dense:
                return
        dense_from = dense_from_tokens() if keep_dense and byte_dot is not None else None
        if byte_dot is not None and dense_from is not None:
            # Dense matmuls win from `dense_from` tokens on this CPU (AMX): keep both.
            if codes is not None:  # the dense weight was never filled from the file
                with torch.no_grad():
                    self.weight.data.copy_(codes.dense(self.weight.dtype))
            self.quantized = dataclasses.replace(byte_dot, max_tokens=dense_from - 1)
            return
        if byte_dot is not None:
            self.quantized = byte_dot
        self.keeps_dense = False
        self.weight.data = torch.empty(0, dtype=self.weight.dtype)

    def _quantize_for_triton(self, method: str) -> None:
        """The weight as a TritonGroupWeight (its file codes exactly, else quantized with
        `method`), serving every step; the dense weight is released."""
        codes = self._take_file_codes(usable=method != "fp8")
        if codes is not None:
            self.quantized = triton_weight_from_codes(codes, self.weight.device)
            self.input_perm = None if codes.input_perm is None else codes.input_perm.to(
                self.weight.device
            )
        else:
            self.quantized = quantize_for_triton(self.weight.data, method)
        self.keeps_dense = False
        self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.weight.device)

    def pack_for_cpu(self) -> None:
        """Move the weight into oneDNN's packed layout (after loading, for speed).

        The plain weight's storage is released so the model is not held twice in memory;
        from then on only forward() uses the weight.
        """
        if self.pending_codes:  # not quantized: the codes become the dense weight
            self._take_file_codes(usable=False)
        if (
            self.packed_weight is not None
            or not self.keeps_dense
            or not can_pack_for_cpu(self.weight)
        ):
            return
        self.packed_weight = pack_weight_for_cpu(self.weight.data)
        self.weight.data = torch.empty(0, dtype=self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., input_size] → [..., output_size], plus the step's LoRA deltas when the
        layer has adapter slots (lora/layers.py) and the step uses any."""
        out = self._base_forward(x)
        if self.lora is not None and self.lora.batch.active:
            out = self.lora.apply(x, out)
        return out

    def _base_forward(self, x: torch.Tensor) -> torch.Tensor:
        if uses_quantized(self.quantized, self.keeps_dense, x.shape[0]):
            assert self.quantized is not None
            if self.input_perm is not None:
                x = x.index_select(-1, self.input_perm)
            out = self.quantized.matmul(x)
            return out if self.bias is None else out + self.bias
        if self.packed_weight is not None:
            return packed_linear(x, self.packed_weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}"


class MergedColumnLinear(Linear):
    """Several linears over the same input fused along the output dim (e.g. gate_up_proj).

    Shard `i` of the checkpoint (e.g. gate_proj = 0, up_proj = 1) fills output rows
    [sum(output_sizes[:i]), sum(output_sizes[:i + 1])).
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def weight_loader(  # type: ignore[override]
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor | GroupCodes,
        shard_id: int | None = None,
    ) -> None:
        """Load shard `shard_id` (an index into output_sizes) of the fused parameter, or
        the whole of it (None: a checkpoint that stores it fused, as Phi-3)."""
        if shard_id is None:
            super().weight_loader(param, loaded_weight)
            return
        offset = sum(self.output_sizes[:shard_id])
        self.load_rows(param, loaded_weight, offset, self.output_sizes[shard_id])


class QKVLinear(Linear):
    """The q, k and v projections fused into one: output is [q | k | v] along the last dim."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
    ) -> None:
        self.q_size = num_heads * head_size
        self.kv_size = num_kv_heads * head_size
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias)

    def weight_loader(  # type: ignore[override]
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor | GroupCodes,
        shard_id: str | None = None,
    ) -> None:
        """Load the "q", "k" or "v" shard of the fused parameter, or the whole of it (None:
        a checkpoint that stores it fused, as Phi-3 and GPT-2)."""
        if shard_id is None:
            super().weight_loader(param, loaded_weight)
            return
        offsets = {
            "q": (0, self.q_size),
            "k": (self.q_size, self.kv_size),
            "v": (self.q_size + self.kv_size, self.kv_size),
        }
        if shard_id not in offsets:
            raise ValueError(f"QKV shard_id must be 'q', 'k' or 'v', got {shard_id!r}.")
        offset, size = offsets[shard_id]
        self.load_rows(param, loaded_weight, offset, size)

    def split_qk_v(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, q_size + 2 * kv_size] → views qk [T, q_size + kv_size] (q and k side by side,
        so RoPE rotates both at once) and v [T, kv_size]."""
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        return qk, v
