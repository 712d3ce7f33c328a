"""Token embedding and the LM head (optionally tied to the embedding).

The LM head is applied only to the hidden states the caller selected (the positions to
sample), never to the whole batch: for small models the vocabulary projection is the largest
matmul of a step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers.linear import (
    QUANTIZED_MAX_TOKENS,
    can_pack_for_cpu,
    default_weight_loader,
    pack_weight_for_cpu,
    packed_linear,
)
from pagedllm.layers.quantization import QuantizedWeight, quantize_int8


class VocabEmbedding(nn.Module):
    """Lookup table [num_embeddings, embedding_dim]: token ids → vectors."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)
        self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] int64 → [T, embedding_dim]."""
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """Hidden states → vocabulary logits; `tie_to` shares the embedding's weight."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, tie_to: VocabEmbedding | None = None
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.is_tied = tie_to is not None
        self.packed_weight: torch.Tensor | None = None
        self.quantized: QuantizedWeight | None = None
        self.keeps_dense = True
        if tie_to is not None:
            # The same Parameter object: loading or casting one updates both.
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(
                torch.empty(num_embeddings, embedding_dim), requires_grad=False
            )
            self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]

    def quantize(self, method: str, keep_dense: bool) -> None:
        """Add an int8 copy for the logits of small steps, whatever `method` the body uses.

        int8, not int4, for either method: the vocabulary projection decides the token
        directly, and GGUF files keep it at 8 bits (Q8_0) for that reason. Without
        `keep_dense` no packed dense copy is made and every step uses the int8 weight (a
        tied weight itself stays for the embedding lookup).
        """
        del method  # the head is int8 for every method, see above
        self.quantized = quantize_int8(self.weight.data)
        self.keeps_dense = keep_dense

    def pack_for_cpu(self) -> None:
        """Keep a oneDNN-packed copy of the weight for the logits matmul (CPU, bfloat16).

        A copy, not a replacement: a tied weight is still read by the embedding lookup.
        """
        if self.packed_weight is None and self.keeps_dense and can_pack_for_cpu(self.weight):
            self.packed_weight = pack_weight_for_cpu(self.weight.data)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, embedding_dim] → [N, num_embeddings] logits."""
        if self.quantized is not None and (
            not self.keeps_dense or hidden_states.shape[0] <= QUANTIZED_MAX_TOKENS
        ):
            return self.quantized.matmul(hidden_states)
        if self.packed_weight is not None:
            return packed_linear(hidden_states, self.packed_weight, None)
        return F.linear(hidden_states, self.weight)
