"""A linear layer's adapters, one slot each, and the step's token → slot grouping.

Each LoRA-able linear layer (qkv_proj, o_proj, gate_up_proj, down_proj) gets a
`LoRALinearSlots` holding every slot's A, stacked over its sub-outputs (q, k, v or gate, up),
and B per sub-output with the scale folded in. A step's tokens are grouped by slot once
(`LoRABatch`). Each layer then adds the deltas of the step's adapters without a loop over
requests:

- one adapter in the step: its tokens are gathered, shrunk (x A^T) and expanded (. B^T),
  and added back (punica's sgmv idea, one segment);
- several: the step's tokens are gathered adapter by adapter into one padded
  [adapters, tokens, in] batch, shrunk and expanded by two batched matmuls against the
  slots' A and B, and added back in one index_add (sgmv as bmm): a fixed handful of ops
  per layer whatever the number of adapters, since on CPU the dispatch is the cost (one
  loop per adapter gave 0.29x of base-only throughput with 8 adapters at batch 64).

In bfloat16 on CPU, steps the C kernel takes (lora/cpu_kernel.py: decodes, or every step
where bfloat16 matmuls are emulated) skip both and add every token's delta in one call.
Tokens without an adapter are untouched (masked or not gathered). The base path (W4A8,
W8A8, dense bf16 or float32) is whatever the layer runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedllm.layers.quantization import LinearMethod
from pagedllm.lora import cpu_kernel
from pagedllm.lora.peft_adapter import LoRAModuleWeights


@dataclass
class LoRABatch:
    """The step's grouping of tokens by slot, made once per step from one sort.

    Attributes:
        max_loras: slots.
        num_tokens: the step's tokens (with or without an adapter).
        order / order_slots: [n] int32, the tokens that have an adapter grouped by slot,
            and their slots (the C kernel's input, csrc/lora.c).
        groups: per slot in use, the batch tokens that run it (slices of `order`).
    """

    max_loras: int = 1
    num_tokens: int = 0
    order: torch.Tensor | None = None
    order_slots: torch.Tensor | None = None
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    _padded: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None

    @property
    def active(self) -> bool:
        """True when some token of the step runs an adapter."""
        return bool(self.groups)

    def clear(self) -> None:
        """A step without adapters."""
        self.num_tokens, self.order, self.order_slots = 0, None, None
        self.groups, self._padded = [], None

    def set_token_slots(self, token_slots: torch.Tensor) -> None:
        """From [T] slot per token (-1: no adapter)."""
        self.num_tokens = int(token_slots.shape[0])
        with_adapter = (token_slots >= 0).nonzero().squeeze(1)
        order = with_adapter[torch.argsort(token_slots[with_adapter], stable=True)]
        slots = token_slots[order]
        used, counts = torch.unique_consecutive(slots, return_counts=True)
        self.groups = list(zip(used.tolist(), order.split(counts.tolist()), strict=True))
        self.order, self.order_slots = order.to(torch.int32), slots.to(torch.int32)
        self._padded = None

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """For the batched matmuls, built on first use in a step: [G * Tmax] each group's
        tokens padded to the largest group with token 0, [G, Tmax, 1] 1 for a real token,
        and [G] the slots in use (None: all slots, in order)."""
        if self._padded is None:
            device = self.groups[0][1].device
            width = max(index.shape[0] for _, index in self.groups)
            index = torch.zeros(len(self.groups), width, dtype=torch.int64, device=device)
            valid = torch.zeros(len(self.groups), width, 1, device=device)
            for row, (_, tokens) in enumerate(self.groups):
                index[row, : tokens.shape[0]] = tokens
                valid[row, : tokens.shape[0]] = 1.0
            used = [slot for slot, _ in self.groups]
            slots = None
            if used != list(range(self.max_loras)):
                slots = torch.tensor(used, dtype=torch.int64, device=device)
            self._padded = (index.view(-1), valid, slots)
        return self._padded


class LoRALinearSlots:
    """Slot weights of one linear layer whose output is `sub_sizes` side by side.

    A is [slots, subs * r, in] (slot s's A of sub j at rows j*r ..); B is one block matrix
    [out, slots * subs * r] whose column block (s, j) holds slot s's B of sub j (scale folded
    in) at sub j's output rows and zeros elsewhere: a slot's shrink (sub, rank) expands
    through all its subs in one matmul.

    Args:
        input_size: the layer's input width.
        sub_sizes: widths of its sub-outputs (q, k, v; gate, up; or one).
        max_loras / max_rank: slots, and the rank every adapter is padded to.
        batch: the step's token grouping (shared by every layer).
    """

    def __init__(
        self,
        input_size: int,
        sub_sizes: list[int],
        max_loras: int,
        max_rank: int,
        batch: LoRABatch,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.input_size = input_size
        self.sub_sizes = sub_sizes
        self.offsets = [sum(sub_sizes[:i]) for i in range(len(sub_sizes))]
        self.max_rank = max_rank
        self.max_loras = max_loras
        self.batch = batch
        self.slot_width = len(sub_sizes) * max_rank  # shrink columns per slot
        self.lora_a = torch.zeros(
            max_loras, self.slot_width, input_size, dtype=dtype, device=device
        )
        self.lora_b = torch.zeros(
            sum(sub_sizes), max_loras * self.slot_width, dtype=dtype, device=device
        )
        # The same weights laid out for batched matmuls (kept in step by set_slot).
        self.lora_a_t = torch.zeros(
            max_loras, input_size, self.slot_width, dtype=dtype, device=device
        )
        self.lora_b_t = torch.zeros(
            max_loras, self.slot_width, sum(sub_sizes), dtype=dtype, device=device
        )
        # For the C kernel (bfloat16 on CPU): per slot, each sub's B^T [r, n_j] at r * o_j.
        self.kernel = cpu_kernel.kernel_library(dtype, device)
        self.lora_b_sub = torch.zeros(
            max_loras if self.kernel is not None else 0, max_rank * sum(sub_sizes),
            dtype=dtype, device=device,
        )
        self.sub_offsets = torch.tensor(
            [*self.offsets, sum(sub_sizes)], dtype=torch.int64, device=device
        )

    def set_slot(self, slot: int, modules: list[LoRAModuleWeights | None]) -> None:
        """Write an adapter into `slot`: modules[i] for sub-output i (None: no delta there).
        Ranks below max_rank are zero-padded (zeros add nothing)."""
        self.lora_a[slot].zero_()
        first = slot * self.slot_width
        self.lora_b[:, first : first + self.slot_width] = 0
        for index, module in enumerate(modules):
            if module is None:
                continue
            rank = module.rank
            row = index * self.max_rank
            self.lora_a[slot, row : row + rank] = module.lora_a.to(self.lora_a.dtype)
            offset, size = self.offsets[index], self.sub_sizes[index]
            column = first + row
            self.lora_b[offset : offset + size, column : column + rank] = (
                module.lora_b * module.scale
            ).to(self.lora_b.dtype)
        self.lora_a_t[slot] = self.lora_a[slot].T
        self.lora_b_t[slot] = self.lora_b[:, first : first + self.slot_width].T
        if self.kernel is not None:
            self._set_kernel_slot(slot, modules)

    def kernel_serves(self, num_tokens: int) -> bool:
        """True when a step of `num_tokens` adds its deltas with the C kernel (the decode
        stack then adds them the same way)."""
        return self.kernel is not None and cpu_kernel.takes(num_tokens)

    def _set_kernel_slot(self, slot: int, modules: list[LoRAModuleWeights | None]) -> None:
        """The slot's B in the C kernel's layout: sub j's B^T [max_rank, n_j], scale folded."""
        flat = self.lora_b_sub[slot]
        flat.zero_()
        for index, module in enumerate(modules):
            if module is None:
                continue
            offset, size = self.offsets[index], self.sub_sizes[index]
            block = flat[self.max_rank * offset : self.max_rank * (offset + size)]
            block = block.view(self.max_rank, size)
            block[: module.rank] = (module.lora_b * module.scale).T.to(block.dtype)

    def apply(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`out` (the base layer's [T, out]) plus each adapter's delta on its tokens."""
        batch = self.batch
        if self.kernel is not None and cpu_kernel.serves(batch, x, out):
            cpu_kernel.add_deltas(self.kernel, batch, x, out, self.lora_a, self.lora_b_sub,
                                  self.sub_offsets, self.max_rank)
            return out
        if len(batch.groups) == 1:
            return self._apply_one(x, out)
        padded_index, padded_valid, slots = batch.padded()
        num_groups, width = padded_valid.shape[:2]
        # Each adapter's tokens side by side, padded: [G, Tmax, in].
        xs = x.index_select(0, padded_index).view(num_groups, width, -1)
        lora_a, lora_b = self.lora_a_t, self.lora_b_t  # [slots, in, w], [slots, w, out]
        if slots is not None:  # some slots idle this step
            lora_a, lora_b = lora_a[slots], lora_b[slots]
        # Padding rows are zeroed in the (narrow) shrink, so they add nothing.
        shrink = torch.bmm(xs, lora_a) * padded_valid.to(xs.dtype)  # [G, Tmax, w]
        delta = torch.bmm(shrink, lora_b)  # [G, Tmax, out]
        out.index_add_(0, padded_index, delta.view(-1, delta.shape[-1]))
        return out

    def _apply_one(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The step's one adapter: gather its tokens, shrink, expand, add back."""
        ((slot, index),) = self.batch.groups
        every_token = index.shape[0] == x.shape[0]
        xs = x if every_token else x.index_select(0, index)  # [n, in]
        first = slot * self.slot_width
        delta = (xs @ self.lora_a[slot].T) @ self.lora_b[:, first : first + self.slot_width].T
        if every_token:
            out += delta.to(out.dtype)
        else:
            out.index_add_(0, index, delta.to(out.dtype))
        return out


class LoRALinearMethod(LinearMethod):
    """A linear layer's method with its adapter slots: the base method, then the step's
    adapter deltas on the tokens that have one. The LoRA manager wraps each LoRA-able
    layer's method in one at start, so the layer's forward stays one call."""

    def __init__(self, base: LinearMethod, slots: LoRALinearSlots) -> None:
        self.base = base
        self.slots = slots

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The base method's output plus the step's deltas (none in a step without
        adapters)."""
        out = self.base.apply(x, bias)
        return self.slots.apply(x, out) if self.slots.batch.active else out

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The base weight (the adapters' deltas depend on the step's tokens)."""
        return self.base.dense(dtype)

    def nbytes(self) -> int:
        """The base method's bytes and the slots' weights."""
        slots = self.slots
        extra = (slots.lora_a, slots.lora_b, slots.lora_a_t, slots.lora_b_t, slots.lora_b_sub)
        return self.base.nbytes() + sum(t.nbytes for t in extra)

    def base_method(self) -> LinearMethod:
        """The base method (itself unwrapped)."""
        return self.base.base_method()

    def quantized_part(self) -> LinearMethod | None:
        """The base method's."""
        return self.base.quantized_part()

    def holds_dense_weight(self) -> bool:
        """The base method's answer."""
        return self.base.holds_dense_weight()
