"""Decoder models with a classification or reward head (HF `*ForSequenceClassification`).

The decoder runs as its causal LM does (paged KV cache, causal attention); its `score`
projection replaces the LM head, and a sequence's scores are those of its last token (what
transformers reads at the last non-padding position). A reward model is the same with one
label. Built from the family's causal LM class, so every registered decoder family gets a
classifier without a file of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any, cast

import torch

from pagedllm.layers.linear import Linear
from pagedllm.models.common import DecoderForCausalLM
from pagedllm.pooling.pooler import last_token_rows

# HF classifier architecture → the causal LM class whose decoder it shares.
CLASSIFIER_BASES: dict[str, tuple[str, str]] = {
    "LlamaForSequenceClassification": ("pagedllm.models.llama", "LlamaForCausalLM"),
    "MistralForSequenceClassification": ("pagedllm.models.llama", "LlamaForCausalLM"),
    "Qwen2ForSequenceClassification": ("pagedllm.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForSequenceClassification": ("pagedllm.models.qwen3", "Qwen3ForCausalLM"),
}


def classifier_class(architecture: str) -> type[DecoderForCausalLM]:
    """The pagedllm class for a decoder `*ForSequenceClassification` architecture.

    Raises:
        ValueError: for an architecture with no classifier here.
    """
    if architecture not in CLASSIFIER_BASES:
        raise ValueError(
            f"Sequence classification architecture {architecture!r} is not supported; "
            f"supported: {', '.join(sorted(CLASSIFIER_BASES))}."
        )
    module_name, class_name = CLASSIFIER_BASES[architecture]
    base = getattr(importlib.import_module(module_name), class_name)
    return _with_score_head(base)


@functools.cache
def _with_score_head(base: type[DecoderForCausalLM]) -> type[DecoderForCausalLM]:
    """`base` with its LM head replaced by a `score` projection (one class per base)."""

    class SequenceClassifier(base):  # type: ignore[valid-type,misc]
        """A decoder whose last token's hidden state is scored into `num_labels` logits."""

        def __init__(self, hf_config: Any) -> None:
            super().__init__(hf_config)
            del self.lm_head
            spec = cast("DecoderForCausalLM", self).spec  # mypy cannot see `base`'s type
            # The score head is never the embedding: its checkpoint tensor must load.
            self.spec = dataclasses.replace(spec, tie_word_embeddings=False)
            self.score = Linear(spec.hidden_size, hf_config.num_labels, bias=False)

        def compute_logits(
            self, hidden_states: torch.Tensor, ranking_only: bool = False
        ) -> torch.Tensor:
            """[N, hidden] → [N, num_labels] float32 scores of those positions."""
            return self.score(hidden_states).float()

        def classify(self, hidden_states: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
            """[T, hidden] of packed sequences → [num_seqs, num_labels], last tokens."""
            return self.compute_logits(hidden_states[last_token_rows(seq_lens)])

    SequenceClassifier.__name__ = base.__name__.replace("ForCausalLM", "ForSequenceClassification")
    return SequenceClassifier
