"""LoRAConfig: how many adapters a step and the host hold, and the largest rank (vLLM's
`enable_lora`, `max_loras`, `max_lora_rank`, `max_cpu_loras`). Must not import torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA limits.

    Attributes:
        max_loras: adapters one step may use (slots on the device).
        max_lora_rank: the largest rank an adapter may have.
        max_cpu_loras: adapters kept loaded on the host (LRU), at least max_loras.
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                f"({self.max_loras})."
            )

    @property
    def cpu_capacity(self) -> int:
        """Adapters kept loaded on the host."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
