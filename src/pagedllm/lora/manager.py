"""The worker's adapters: a host LRU of loaded adapters and the step's device slots.

At start every LoRA-able linear layer of the model gets its slot weights (lora/layers.py).
Before each step the model runner hands over the step's rows (their adapter, their token
count): adapters already in a slot stay, others take the least recently used slot, and
the tokens are grouped by slot for every layer to read. Loading reads the PEFT folder
(peft_adapter.py) once; the host keeps `max_cpu_loras` of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from pagedllm.lora.config import LoRAConfig
from pagedllm.lora.layers import LoRABatch, LoRALinearMethod, LoRALinearSlots
from pagedllm.lora.peft_adapter import PeftAdapter, load_peft_adapter
from pagedllm.lora.request import LoRARequest

# Our fused layers, the PEFT modules they hold, in output order.
_TARGETS = (
    ("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("self_attn", "o_proj", ("o_proj",)),
    ("mlp", "gate_up_proj", ("gate_proj", "up_proj")),
    ("mlp", "down_proj", ("down_proj",)),
)


class LoRAModelManager:
    """Adapters of one model: host cache, device slots, the step's grouping."""

    def __init__(
        self, model: nn.Module, config: LoRAConfig, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.config = config
        self.batch = LoRABatch(max_loras=config.max_loras)
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None:
            raise ValueError("LoRA is built for decoder models (model.layers).")
        # (layer index, our module name) → its slots, and the PEFT names it takes.
        self.layer_slots: list[tuple[int, LoRALinearSlots, tuple[str, ...]]] = []
        for index, layer in enumerate(layers):
            for parent_name, name, peft_names in _TARGETS:
                linear = getattr(getattr(layer, parent_name, None), name, None)
                if linear is None or not hasattr(linear, "input_size"):
                    raise ValueError(
                        f"LoRA needs Llama-style layers ({parent_name}.{name}); layer {index} "
                        "has none."
                    )
                if getattr(linear, "tp_size", 1) > 1:
                    raise ValueError("LoRA adapters on tensor-parallel layers are not built.")
                sizes = list(getattr(linear, "output_sizes", None) or [])
                if name == "qkv_proj":
                    sizes = [linear.q_size, linear.kv_size, linear.kv_size]
                sizes = sizes or [linear.output_size]
                slots = LoRALinearSlots(
                    linear.input_size, sizes, config.max_loras, config.max_lora_rank,
                    self.batch, dtype, device,
                )
                linear.method = LoRALinearMethod(linear.method, slots)
                self.layer_slots.append((index, slots, peft_names))
        self.device = device
        self._loaded: OrderedDict[int, PeftAdapter] = OrderedDict()  # host LRU
        self._slot_of: OrderedDict[int, int] = OrderedDict()  # lora id → slot, LRU order

    def load(self, request: LoRARequest) -> PeftAdapter:
        """The adapter, read once and kept (LRU) among `max_cpu_loras`."""
        adapter = self._loaded.get(request.lora_int_id)
        if adapter is None:
            adapter = load_peft_adapter(
                request.lora_name, request.lora_path, self.config.max_lora_rank
            )
            self._check_layers(adapter, request)
            self._loaded[request.lora_int_id] = adapter
            while len(self._loaded) > self.config.cpu_capacity:
                evicted, _ = self._loaded.popitem(last=False)
                self._slot_of.pop(evicted, None)
        self._loaded.move_to_end(request.lora_int_id)
        return adapter

    def _check_layers(self, adapter: PeftAdapter, request: LoRARequest) -> None:
        """Refuse an adapter made for another model (its layers or shapes do not fit)."""
        shapes = {
            (layer_index, peft_name): (slots.sub_sizes[i], slots.input_size)
            for layer_index, slots, peft_names in self.layer_slots
            for i, peft_name in enumerate(peft_names)
        }
        num_layers = 1 + max((i for i, _, _ in self.layer_slots), default=-1)
        for (layer_index, name), module in adapter.modules.items():
            if layer_index >= num_layers:
                raise ValueError(
                    f"LoRA adapter {request.lora_name!r} has weights for layer {layer_index}; "
                    f"the model has {num_layers}."
                )
            out_size, in_size = shapes[layer_index, name]
            got = (int(module.lora_b.shape[0]), int(module.lora_a.shape[1]))
            if got != (out_size, in_size):
                raise ValueError(
                    f"LoRA adapter {request.lora_name!r}: layer {layer_index} {name} maps "
                    f"{got[1]} -> {got[0]} features; the model's maps {in_size} -> {out_size} "
                    "(an adapter for another model?)."
                )

    def add(self, request: LoRARequest) -> None:
        """Load the adapter now (host LRU), so a bad one fails here, not in a step.

        Raises:
            ValueError: a missing or unsupported adapter, or one made for another model.
        """
        cached = self._loaded.get(request.lora_int_id)
        if cached is not None and cached.path != request.lora_path:
            raise ValueError(
                f"LoRA id {request.lora_int_id} is already {cached.name!r} from "
                f"{cached.path!r}; give {request.lora_name!r} its own lora_int_id."
            )
        self.load(request)

    def loaded_ids(self) -> list[int]:
        """The adapters on the host, least recently used first."""
        return list(self._loaded)

    def remove(self, lora_int_id: int) -> None:
        """Forget an adapter (host copy and slot)."""
        self._loaded.pop(lora_int_id, None)
        self._slot_of.pop(lora_int_id, None)

    def prepare_step(
        self, rows: Sequence[tuple[LoRARequest | None, int]], device: torch.device
    ) -> None:
        """Slot the step's adapters and group its tokens: rows in batch order, each
        (its adapter or None, its token count)."""
        used = {r.lora_int_id: r for r, _ in rows if r is not None}
        if not used:
            self.batch.clear()
            return
        assert len(used) <= self.config.max_loras, "the scheduler bounds a step's adapters"
        slot_ids = {lora_id: self._slot(request, used) for lora_id, request in used.items()}
        row_slots = torch.tensor(
            [slot_ids[r.lora_int_id] if r is not None else -1 for r, _ in rows]
        )
        counts = torch.tensor([count for _, count in rows])
        self.batch.set_token_slots(torch.repeat_interleave(row_slots, counts).to(device))

    def _slot(self, request: LoRARequest, used: dict[int, LoRARequest]) -> int:
        """The adapter's slot, loading it into the least recently used free one."""
        lora_id = request.lora_int_id
        if lora_id in self._slot_of:
            self._slot_of.move_to_end(lora_id)
            return self._slot_of[lora_id]
        taken = set(self._slot_of.values())
        if len(taken) < self.config.max_loras:
            slot = min(set(range(self.config.max_loras)) - taken)
        else:
            victim = next(i for i in self._slot_of if i not in used)
            slot = self._slot_of.pop(victim)
        adapter = self.load(request)
        for layer_index, slots, peft_names in self.layer_slots:
            slots.set_slot(slot, [adapter.modules.get((layer_index, n)) for n in peft_names])
        self._slot_of[lora_id] = slot
        return slot
