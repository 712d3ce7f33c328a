"""The C multi-LoRA kernel (csrc/lora.c) against the float32 definition of the delta."""

from __future__ import annotations

import pytest
import torch

from pagedllm.lora import cpu_kernel
from pagedllm.lora.layers import LoRABatch, LoRALinearSlots
from pagedllm.lora.peft_adapter import LoRAModuleWeights

SUB_SIZES = [96, 32, 32]  # a fused qkv: three sub-outputs
IN_SIZE, MAX_RANK, SLOTS = 64, 8, 3


def _slots() -> tuple[LoRALinearSlots, LoRABatch, list[list[LoRAModuleWeights | None]]]:
    batch = LoRABatch(max_loras=SLOTS)
    slots = LoRALinearSlots(IN_SIZE, SUB_SIZES, SLOTS, MAX_RANK, batch, torch.bfloat16,
                            torch.device("cpu"))
    if slots.kernel is None:
        pytest.skip("the C kernels are not built here")
    generator = torch.Generator().manual_seed(0)
    adapters = []
    for slot, rank in enumerate((8, 3, 5)):  # lower ranks are zero-padded
        modules: list[LoRAModuleWeights | None] = [
            None if (slot == 1 and sub == 1) else LoRAModuleWeights(
                torch.randn(rank, IN_SIZE, generator=generator),
                torch.randn(size, rank, generator=generator), 0.5 + slot)
            for sub, size in enumerate(SUB_SIZES)
        ]
        slots.set_slot(slot, modules)
        adapters.append(modules)
    return slots, batch, adapters


@pytest.mark.parametrize("num_tokens", [1, 7, 40])
def test_kernel_adds_each_tokens_adapter_delta(num_tokens):
    slots, batch, adapters = _slots()
    generator = torch.Generator().manual_seed(num_tokens)
    token_slots = torch.randint(-1, SLOTS, (num_tokens,), generator=generator)
    batch.set_token_slots(token_slots)
    x = torch.randn(num_tokens, IN_SIZE, generator=generator).to(torch.bfloat16)
    out = torch.randn(num_tokens, sum(SUB_SIZES), generator=generator).to(torch.bfloat16)
    assert cpu_kernel.serves(batch, x, out)
    got = slots.apply(x, out.clone())
    # The definition, in float32: out + scale * (x A^T) B^T per sub-output, rounded once.
    want = out.float().clone()
    for t, slot in enumerate(token_slots.tolist()):
        if slot < 0:
            continue
        column = 0
        for module, size in zip(adapters[slot], SUB_SIZES, strict=True):
            if module is not None:
                a = module.lora_a.to(torch.bfloat16).float()
                b = (module.lora_b * module.scale).to(torch.bfloat16).float()
                want[t, column : column + size] += (x[t].float() @ a.T) @ b.T
            column += size
    want = want.to(torch.bfloat16)
    untouched = token_slots < 0
    assert torch.equal(got[untouched], out[untouched])  # no adapter: not a bit changed
    # Equal up to float32 summation order: at most one bfloat16 rounding step apart.
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-3)


def test_large_steps_use_torch_batched_matmuls(monkeypatch):
    slots, batch, _ = _slots()
    batch.set_token_slots(torch.tensor([0, 1, 2, -1]))
    x = torch.randn(4, IN_SIZE).to(torch.bfloat16)
    out = torch.zeros(4, sum(SUB_SIZES), dtype=torch.bfloat16)
    with_kernel = slots.apply(x, out.clone())
    monkeypatch.setattr(cpu_kernel, "MAX_TOKENS", 2)
    assert not slots.kernel_serves(4) and not cpu_kernel.serves(batch, x, out)
    with_torch = slots.apply(x, out.clone())
    # torch rounds the shrink and the delta to bfloat16 as well: a few roundings apart.
    scale = with_kernel.float().abs().max().item()
    torch.testing.assert_close(with_torch.float(), with_kernel.float(), rtol=0,
                               atol=2 ** -6 * scale)
