"""Token embedding and the LM head (optionally tied to the embedding).

The LM head is applied only to the hidden states the caller selected (the positions to
sample), never to the whole batch: for small models the vocabulary projection is the largest
matmul of a step.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers.dense_crossover import dense_from_tokens
from pagedllm.layers.linear import (
    can_pack_for_cpu,
    default_weight_loader,
    pack_weight_for_cpu,
    packed_linear,
    uses_quantized,
)
from pagedllm.layers.quantization import (
    QuantizedWeight,
    W4A8Weight,
    can_quantize_w4a8,
    quantize_int8,
    quantize_w4a8,
    quantize_w8a8,
    w8a8_from_codes,
)
from pagedllm.layers.triton_quantization import (
    TritonGroupWeight,
    quantize_for_triton,
    triton_weight_from_codes,
    uses_triton_weights,
)

# Logits per row recomputed in float32 after a reduced-precision vocabulary matmul.
REFINED_CANDIDATES = 8


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
        self.quantized: QuantizedWeight | TritonGroupWeight | None = None
        self.ranking_shortlist: W4A8Weight | None = None
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
        """Add a quantized copy for the logits, whatever `method` the body uses.

        int8 for either method: the vocabulary projection decides the token directly, and
        GGUF files keep it at 8 bits (Q8_0) for that reason. bfloat16 CPU models use Q8_0's
        own form with int8 activations (W8A8Weight, our VNNI kernel) for every step (with
        `keep_dense`, large ones go dense where that wins: dense_crossover.py), and the
        top REFINED_CANDIDATES logits are then recomputed in float32 from the dense weight;
        a Q8_0 GGUF matrix is taken with its own codes and scales (exactly). With
        `keep_dense` they also get a 4-bit copy (W4A8Weight, 1.5 MB per 1k rows) for steps
        that only need each row's argmax (`ranking_only`): it reads half the bytes, but its
        noise over the 49k logits would bias their softmax normaliser (perplexity +4% on
        natural text, measured), so it never serves logprobs or sampling.
        Other models get torch's int8 weight for small steps, and for every step without
        `keep_dense` (no packed dense copy is made then). The weight itself stays: a tied
        one for the embedding lookup, and either for the refinement.
        """
        del method  # the head's format does not follow the body's, see above
        self.keeps_dense = keep_dense
        # Q8_0 codes of the file (loaded by default_weight_loader): used as they are.
        codes = getattr(self.weight, "file_codes", None)
        if codes is not None:
            del self.weight.file_codes  # type: ignore[attr-defined]
        if uses_triton_weights(self.weight.device):  # the GPU's group format, every step
            if codes is not None and not codes.is_int4:
                self.quantized = triton_weight_from_codes(codes, self.weight.device)
            else:
                self.quantized = quantize_for_triton(self.weight.data, "int8")
        elif can_quantize_w4a8(self.weight.data):
            if codes is not None and not codes.is_int4:
                self.quantized = w8a8_from_codes(codes)
            else:
                self.quantized = quantize_w8a8(self.weight.data)
            if keep_dense:
                self.ranking_shortlist = quantize_w4a8(self.weight.data)
                dense_from = dense_from_tokens()
                if dense_from is not None:  # large steps on the packed dense copy (AMX)
                    self.quantized = replace(self.quantized, max_tokens=dense_from - 1)
                    self.ranking_shortlist = replace(
                        self.ranking_shortlist, max_tokens=dense_from - 1
                    )
        else:
            self.quantized = quantize_int8(self.weight.data)

    def pack_for_cpu(self) -> None:
        """Keep a oneDNN-packed copy of the weight for the logits matmul (CPU, bfloat16),
        unless a quantized copy serves every step.

        A copy, not a replacement: a tied weight is still read by the embedding lookup.
        """
        if (
            self.packed_weight is None
            and self.keeps_dense
            and (self.quantized is None or self.quantized.max_tokens is not None)
            and can_pack_for_cpu(self.weight)
        ):
            self.packed_weight = pack_weight_for_cpu(self.weight.data)

    def forward(self, hidden_states: torch.Tensor, ranking_only: bool = False) -> torch.Tensor:
        """[N, embedding_dim] → [N, num_embeddings] float32 logits.

        With `ranking_only` the caller uses only each row's argmax: the step may then
        shortlist with the 4-bit copy, whose top candidates are refined as below.

        The vocabulary matmul runs in the model dtype (or int8); when that is not float32,
        the top REFINED_CANDIDATES logits of each row are then recomputed exactly in float32.
        bfloat16 logits keep 8 significant bits, so close candidates often round to the very
        same value and greedy decoding would pick between them arbitrarily; the refined
        values decide as float32 would, for the cost of a top-k and a few dot products.
        """
        logits = self._raw_logits(hidden_states, ranking_only)
        if logits.dtype == torch.float32 and self.quantized is None:
            return logits
        logits = logits.float()
        candidates, exact = self._refine_top_candidates(hidden_states, logits)
        return logits.scatter_(1, candidates, exact)

    def greedy_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, embedding_dim] → [N] int64: the argmax of `forward(..., ranking_only=True)`,
        taken among the refined top candidates straight from the model-dtype logits: no
        [N, vocab] float32 copy, scatter or second pass over the vocabulary (for a 262k
        vocabulary those cost more than the matmul itself)."""
        logits = self._raw_logits(hidden_states, ranking_only=True)
        if logits.dtype == torch.float32 and self.quantized is None:
            return logits.argmax(dim=-1)
        candidates, exact = self._refine_top_candidates(hidden_states, logits)
        return candidates.gather(1, exact.argmax(dim=-1, keepdim=True)).squeeze(1)

    def _raw_logits(self, hidden_states: torch.Tensor, ranking_only: bool) -> torch.Tensor:
        """[N, vocab] logits from the fastest weight for this step, in its own dtype."""
        num_tokens = hidden_states.shape[0]
        if ranking_only and uses_quantized(self.ranking_shortlist, self.keeps_dense, num_tokens):
            assert self.ranking_shortlist is not None
            return self.ranking_shortlist.matmul(hidden_states)
        if uses_quantized(self.quantized, self.keeps_dense, num_tokens):
            assert self.quantized is not None
            return self.quantized.matmul(hidden_states)
        if self.packed_weight is not None:
            return packed_linear(hidden_states, self.packed_weight, None)
        return F.linear(hidden_states, self.weight)

    def _refine_top_candidates(
        self, hidden: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's top REFINED_CANDIDATES token ids [N, k] and their float32 logits."""
        k = min(REFINED_CANDIDATES, logits.shape[-1])
        candidates = logits.topk(k, dim=-1).indices  # [N, k]; bf16 → f32 keeps the order
        rows = self.weight[candidates].float()  # [N, k, embedding_dim]
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)  # [N, k]
        return candidates, exact
