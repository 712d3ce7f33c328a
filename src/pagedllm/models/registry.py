"""Map HF architecture names to pagedllm model classes, imported lazily.

A model module is imported only when its architecture is asked for, so an unused family's
import cost (or breakage) never touches other models. This module builds no models.
"""

from __future__ import annotations

import importlib
from typing import Any

# HF `architectures[0]` → (module, class). Mistral is the llama architecture with a window
# that verify_model_support rejects when it would matter.
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("pagedllm.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("pagedllm.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("pagedllm.models.qwen2", "Qwen2ForCausalLM"),
}


class ModelRegistry:
    """Architecture name → model class, with lazy imports and clear errors."""

    def __init__(self, models: dict[str, tuple[str, str]] | None = None) -> None:
        self._models = dict(_MODELS if models is None else models)

    def supported_architectures(self) -> list[str]:
        """Names accepted by `resolve`, sorted."""
        return sorted(self._models)

    def resolve(self, architecture: str) -> type:
        """Import and return the class for `architecture`.

        Raises:
            ValueError: for an architecture with no implementation here.
        """
        if architecture not in self._models:
            raise ValueError(
                f"Model architecture {architecture!r} is not supported. Supported "
                f"architectures: {', '.join(self.supported_architectures())}."
            )
        module_name, class_name = self._models[architecture]
        return getattr(importlib.import_module(module_name), class_name)


_REGISTRY = ModelRegistry()


def resolve_model_class(architecture: str) -> type:
    """The pagedllm class implementing HF `architecture` (see ModelRegistry.resolve)."""
    return _REGISTRY.resolve(architecture)


def supported_architectures() -> list[str]:
    """All architecture names pagedllm can run."""
    return _REGISTRY.supported_architectures()


def verify_model_support(hf_config: Any, max_model_len: int) -> None:
    """Reject configs whose attention pagedllm would compute wrongly at this length.

    Sliding-window attention is not implemented: a window shorter than `max_model_len` would
    silently let tokens attend further back than the model was trained to.

    Raises:
        ValueError: when the checkpoint's sliding window is smaller than max_model_len.
    """
    window = get_sliding_window(hf_config)
    if window is not None and window < max_model_len:
        raise ValueError(
            f"This model uses sliding-window attention (sliding_window={window}), which "
            f"pagedllm does not implement, and max_model_len={max_model_len} exceeds the "
            f"window. Pass max_model_len <= {window} to run it with exact results."
        )


def get_sliding_window(hf_config: Any) -> int | None:
    """The attention window the checkpoint uses, or None when every layer attends fully."""
    window = getattr(hf_config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return None
    # Qwen2 configs carry a window that is off unless `use_sliding_window` says otherwise.
    if getattr(hf_config, "model_type", None) == "qwen2" and not getattr(
        hf_config, "use_sliding_window", False
    ):
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types and "sliding_attention" not in layer_types:
        return None
    return window
