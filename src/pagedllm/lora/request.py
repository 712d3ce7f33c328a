"""LoRARequest: which adapter a request runs with (vLLM's `vllm.lora.request.LoRARequest`)."""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """A PEFT adapter to apply to one request.

    Attributes:
        lora_name: the adapter's name (the server's model name for it).
        lora_int_id: a positive id, unique per adapter: the adapter's identity in the engine
            (slots, the prefix cache).
        lora_path: the folder with adapter_config.json and the adapter weights.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id!r}.")
        if not self.lora_path:
            raise ValueError(f"LoRA adapter {self.lora_name!r} needs a lora_path.")

    @property
    def adapter_id(self) -> int:
        """vLLM's other name for lora_int_id."""
        return self.lora_int_id
