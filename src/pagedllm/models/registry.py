"""Map HF architecture names to pagedllm model classes, imported lazily.

A model module is imported only when its architecture is asked for, so an unused family's
import cost (or breakage) never touches other models. It builds models only on the meta
device, to check a config early (check_model_config).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
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
    # Vision-language models (images in; multimodal/ processes their inputs).
    "LlavaForConditionalGeneration": ("pagedllm.models.llava", "LlavaForConditionalGeneration"),
    "Gemma3ForConditionalGeneration": (
        "pagedllm.models.gemma3_mm", "Gemma3ForConditionalGeneration"
    ),
    "Qwen2VLForConditionalGeneration": (
        "pagedllm.models.qwen2_vl", "Qwen2VLForConditionalGeneration"
    ),
    "Idefics3ForConditionalGeneration": (
        "pagedllm.models.idefics3", "Idefics3ForConditionalGeneration"
    ),
    "Qwen2_5_VLForConditionalGeneration": (
        "pagedllm.models.qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"
    ),
}


# transformers' model_type → the causal LM architecture, for configs that name no
# `architectures`: GGUF configs, and a vision-language model's nested text config.
MODEL_TYPE_TO_ARCHITECTURE: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "opt": "OPTForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def text_architecture(text_config: Any) -> str:
    """The causal-LM architecture of a vision-language model's text config.

    Raises:
        ValueError: for a text model not built here.
    """
    model_type = getattr(text_config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_ARCHITECTURE:
        raise ValueError(
            f"Text model type {model_type!r} of this vision-language model is not supported "
            f"(supported: {', '.join(sorted(MODEL_TYPE_TO_ARCHITECTURE))})."
        )
    return MODEL_TYPE_TO_ARCHITECTURE[model_type]


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
        if architecture not in self._models and _is_pooling_architecture(architecture):
            raise ValueError(
                f"{architecture} is a pooling model (embeddings, classification or scores): "
                "it runs with runner='pooling' (the default for it), not as a generator."
            )
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


def check_model_config(
    architecture: str, hf_config: Any, runner: str = "generate", convert: str | None = None
) -> None:
    """Build the model for `hf_config` on the meta device (no memory, no weights), so that a
    config it cannot run (an option not built here) fails when the engine is configured,
    with the model's own ValueError, rather than at load time in the engine process.

    Raises:
        ValueError: for an unsupported architecture or config.
    """
    import torch

    model_class = resolve_runner(architecture, runner, convert or "auto").model_class
    with torch.device("meta"):
        model_class(hf_config)


# Pooling models: HF architecture → (module, class, the tasks it serves, default pooling).
# Encoders embed (their pooling usually comes from a sentence-transformers folder), sequence
# classifiers classify and score (cross-encoders); decoder classifiers read the last token.
_POOLING_MODELS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "BertModel": ("pagedllm.models.bert", "BertModel", ("embed", "encode"), "CLS"),
    "XLMRobertaModel": ("pagedllm.models.bert", "XLMRobertaModel", ("embed", "encode"), "CLS"),
    "BertForSequenceClassification": (
        "pagedllm.models.bert", "BertForSequenceClassification", ("classify", "score"), "CLS"
    ),
    "XLMRobertaForSequenceClassification": (
        "pagedllm.models.bert", "XLMRobertaForSequenceClassification", ("classify", "score"),
        "CLS",
    ),
}
_DECODER_CLASSIFIER_TASKS = ("classify", "score", "reward")
# A generating decoder used as an embedder (convert="embed", Qwen3-Embedding style).
_DECODER_EMBED_TASKS = ("embed", "encode")


@dataclass(frozen=True)
class RunnerChoice:
    """How a checkpoint runs: which runner, which class, which pooling tasks.

    Attributes:
        runner: "generate" or "pooling".
        model_class: the pagedllm class.
        supported_tasks: the pooling tasks it serves (("generate",) for generation).
        default_pooling_type: how it pools unless its folder or the user says otherwise.
        convert: "embed" when a generating decoder is used as an embedder, else None.
    """

    runner: str
    model_class: type
    supported_tasks: tuple[str, ...]
    default_pooling_type: str | None = None
    convert: str | None = None


def resolve_runner(architecture: str, runner: str = "auto", convert: str = "auto") -> RunnerChoice:
    """The runner and model class for `architecture`, as vLLM picks them: `auto` follows the
    architecture (pooling ones pool); `runner="pooling"` or `convert="embed"` on a
    generating decoder makes it an embedder with last-token pooling; `runner="generate"`
    with `convert="embed"` keeps generation and adds embeddings (one engine for both).

    Raises:
        ValueError: for an unknown runner / convert value, a generating runner asked of a
            pooling-only architecture, or an architecture built for neither.
    """
    from pagedllm.models.sequence_classification import CLASSIFIER_BASES, classifier_class

    if runner not in ("auto", "generate", "pooling"):
        raise ValueError(f"runner must be 'auto', 'generate' or 'pooling', got {runner!r}.")
    if convert not in ("auto", "none", "embed", "classify"):
        raise ValueError(
            f"convert must be 'auto', 'none', 'embed' or 'classify', got {convert!r}."
        )
    if runner == "generate" and _is_pooling_architecture(architecture):
        raise ValueError(f"{architecture} is a pooling model: it cannot run runner='generate'.")
    if architecture in _POOLING_MODELS:
        module_name, class_name, tasks, pooling = _POOLING_MODELS[architecture]
        model_class = getattr(importlib.import_module(module_name), class_name)
        return RunnerChoice("pooling", model_class, tasks, pooling)
    if architecture in CLASSIFIER_BASES:
        return RunnerChoice(
            "pooling", classifier_class(architecture), _DECODER_CLASSIFIER_TASKS, "LAST"
        )
    model_class = _REGISTRY.resolve(architecture)  # a generating decoder (or a ValueError)
    if convert == "classify":
        raise ValueError(
            f"convert='classify' needs a *ForSequenceClassification checkpoint; "
            f"{architecture} has no classification head."
        )
    if runner == "generate" and convert == "embed":
        # Both in one engine: generation, and embeddings beside it (a RAG server's pair).
        tasks = ("generate", *_DECODER_EMBED_TASKS)
        return RunnerChoice("generate", model_class, tasks, "LAST", "embed")
    if runner == "pooling" or convert == "embed":
        return RunnerChoice("pooling", model_class, _DECODER_EMBED_TASKS, "LAST", "embed")
    return RunnerChoice("generate", model_class, ("generate",))


def _is_pooling_architecture(architecture: str) -> bool:
    """True for the encoder and classifier architectures resolve_runner knows."""
    from pagedllm.models.sequence_classification import CLASSIFIER_BASES

    return architecture in _POOLING_MODELS or architecture in CLASSIFIER_BASES
