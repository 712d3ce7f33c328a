"""A linear layer's adapters, one slot each, and the step's token → slot grouping.

Each LoRA-able linear layer (qkv_proj, o_proj, gate_up_proj, down_proj) gets a
`LoRALinearSlots` holding every slot's A, stacked over its sub-outputs (q, k, v or gate, up),
and B per sub-output with the scale folded in. A step's tokens are grouped by slot once
(`LoRABatch`); each layer then adds, per adapter in the step (not per request), the
shrink-then-expand delta of that adapter's tokens in two matmuls: the segmented idea of
punica's sgmv, with one gather and one index_add per adapter. Tokens without an adapter are
untouched. The base path (W4A8, W8A8, dense bf16 or float32) is whatever the layer runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedllm.lora.peft_adapter import LoRAModuleWeights


@dataclass
class LoRABatch:
    """The step's grouping: per slot in use, the batch tokens that run it."""

    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    @property
    def active(self) -> bool:
        """True when some token of the step runs an adapter."""
        return bool(self.groups)

    def set_token_slots(self, token_slots: torch.Tensor) -> None:
        """From [T] slot per token (-1: no adapter)."""
        self.groups = [
            (int(slot), (token_slots == slot).nonzero().squeeze(1))
            for slot in torch.unique(token_slots).tolist()
            if slot >= 0
        ]


class LoRALinearSlots:
    """Slot weights of one linear layer whose output is `sub_sizes` side by side.

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
        self.sub_sizes = sub_sizes
        self.offsets = [sum(sub_sizes[:i]) for i in range(len(sub_sizes))]
        self.max_rank = max_rank
        self.batch = batch
        self.lora_a = torch.zeros(
            max_loras, len(sub_sizes) * max_rank, input_size, dtype=dtype, device=device
        )
        self.lora_b = [
            torch.zeros(max_loras, size, max_rank, dtype=dtype, device=device)
            for size in sub_sizes
        ]

    def set_slot(self, slot: int, modules: list[LoRAModuleWeights | None]) -> None:
        """Write an adapter into `slot`: modules[i] for sub-output i (None: no delta there).
        Ranks below max_rank are zero-padded (zeros add nothing)."""
        self.lora_a[slot].zero_()
        for index, module in enumerate(modules):
            self.lora_b[index][slot].zero_()
            if module is None:
                continue
            rank = module.rank
            rows = slice(index * self.max_rank, index * self.max_rank + rank)
            self.lora_a[slot, rows] = module.lora_a.to(self.lora_a.dtype)
            self.lora_b[index][slot, :, :rank] = (module.lora_b * module.scale).to(
                self.lora_a.dtype
            )

    def apply(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`out` (the base layer's [T, out]) plus each adapter's delta on its tokens."""
        rank = self.max_rank
        for slot, index in self.batch.groups:
            xs = x.index_select(0, index)  # [n, in]
            shrink = xs @ self.lora_a[slot].T  # [n, subs * r]
            for sub, (offset, size) in enumerate(zip(self.offsets, self.sub_sizes, strict=True)):
                delta = shrink[:, sub * rank : (sub + 1) * rank] @ self.lora_b[sub][slot].T
                out[:, offset : offset + size].index_add_(0, index, delta.to(out.dtype))
        return out
