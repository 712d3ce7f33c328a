"""Linear layers whose parameters know how to load (possibly fused) checkpoint shards, and
that run through the linear method chosen for them once loading ends.

Each parameter carries a `weight_loader` hook, so a model's `load_weights` is pure data
mapping: HF names in, hook calls out. Fused layers (QKV, gate-up) keep one matmul per step
instead of three or two. A checkpoint's group codes (GGUF, GPTQ, AWQ) are kept aside
as they load; `process_weights_after_loading` then has layers/quantization/selection.py
choose the layer's method (dense, packed, W4A8, Triton groups, ...) from its format and
platform, and every forward is one call of that method. Nothing in this file knows about
models, attention or the KV cache.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.layers.quantization import (
    DenseMethod,
    GroupCodes,
    LinearMethod,
    WeightPlan,
    select_linear_method,
)


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
    """y = x W^T (+ b), with W of shape [output_size, input_size] as in HF checkpoints.

    Until `process_weights_after_loading` it multiplies its dense weight; from then on its
    method (one per format and platform: layers/quantization/). A LoRA adapter's slots
    wrap that method (lora/layers.py), so a forward is always one call.
    """

    # False for layers that stay dense whatever the model's quantization (an MoE router:
    # a quantized router would send tokens to other experts).
    quantizable = True
    # Registered by LinearMethod.create_weights.
    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        # Uninitialised: every parameter is filled by load_weights.
        LinearMethod.create_weights(self, input_size, output_size, bias)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.method: LinearMethod = DenseMethod(self.weight)
        # File codes of the weight's rows, by first row, until loading ends.
        self.pending_codes: list[tuple[int, GroupCodes]] = []

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
        kept for its method, which repacks them without a dense copy)."""
        _check_shard(param, tuple(loaded.shape), offset, size)
        if isinstance(loaded, GroupCodes):
            if param is self.weight:
                self.pending_codes.append((offset, loaded))
                return
            loaded = loaded.dense(param.dtype)
        with torch.no_grad():
            param.narrow(0, offset, size).copy_(loaded)

    def take_file_codes(self, usable: bool) -> GroupCodes | None:
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

    def release_dense_weight(self) -> None:
        """Free the dense weight's memory (its method holds the weight in its own format)."""
        self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.weight.device)

    def process_weights_after_loading(
        self, quantization: str | None = None, keep_dense: bool = True
    ) -> None:
        """Choose and build this layer's method for `quantization` ("int4", "int8", "fp8";
        None: dense) on its platform (layers/quantization/selection.py). With `keep_dense`
        False no dense copy stays where a quantized method can serve every step (least
        memory)."""
        plan = WeightPlan(quantization, keep_dense)
        self.method = select_linear_method(self, plan, self.quantizable)

    @property
    def quantized(self) -> LinearMethod | None:
        """The quantized weight the method runs (None: dense weights only); a view for
        inspection, the method is the state."""
        return self.method.base_method().quantized_part()

    @property
    def input_perm(self) -> torch.Tensor | None:
        """The input order the quantized weight reads (GPTQ act-order; None: the layer's
        own); a view of the method."""
        return self.method.base_method().input_order()

    @property
    def keeps_dense(self) -> bool:
        """Whether a dense weight serves some steps (a view of the method)."""
        return self.method.base_method().holds_dense_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., input_size] → [..., output_size]: the method (with the step's LoRA deltas
        when adapter slots wrap it)."""
        return self.method.apply(x, self.bias)

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}, "
                f"method={type(self.method).__name__}")


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
