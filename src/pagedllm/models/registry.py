"""Map HF architecture names to pagedllm model classes, imported lazily.

A model module is imported only when its architecture is asked for, so an unused family's
import cost (or breakage) never touches other models. It builds models only on the meta
device, to check a config early (check_model_config).
"""

from __future__ import annotations

import importlib
from typing import Any

# HF `architectures[0]` → (module, class). Mistral is the llama architecture (its sliding
# window comes from the config).
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("pagedllm.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("pagedllm.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("pagedllm.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("pagedllm.models.qwen3", "Qwen3ForCausalLM"),
    "Gemma3ForCausalLM": ("pagedllm.models.gemma3", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("pagedllm.models.phi3", "Phi3ForCausalLM"),
    "GPT2LMHeadModel": ("pagedllm.models.gpt2", "GPT2LMHeadModel"),
    "OPTForCausalLM": ("pagedllm.models.opt", "OPTForCausalLM"),
    "MixtralForCausalLM": ("pagedllm.models.moe", "MixtralForCausalLM"),
    "Qwen2MoeForCausalLM": ("pagedllm.models.moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("pagedllm.models.moe", "Qwen3MoeForCausalLM"),
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


def check_model_config(architecture: str, hf_config: Any) -> None:
    """Build the model for `hf_config` on the meta device (no memory, no weights), so that a
    config it cannot run (an option not built here) fails when the engine is configured,
    with the model's own ValueError, rather than at load time in the engine process.

    Raises:
        ValueError: for an unsupported architecture or config.
    """
    import torch

    model_class = resolve_model_class(architecture)
    with torch.device("meta"):
        model_class(hf_config)
