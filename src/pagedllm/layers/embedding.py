"""Token embedding and the LM head (optionally tied to the embedding).

The LM head is applied only to the hidden states the caller selected (the positions to
sample), never to the whole batch: for small models the vocabulary projection is the largest
matmul of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.kernels.abi import StackMatrix
from pagedllm.layers import cpu_ops
from pagedllm.layers.cpu_tables import method_kernel_parts, parts_matrix
from pagedllm.layers.linear import default_weight_loader
from pagedllm.layers.nonfinite import mark_nonfinite_rows
from pagedllm.layers.quantization import (
    DenseMethod,
    LinearMethod,
    WeightPlan,
    select_lm_head_methods,
)

# Logits per row recomputed in float32 after a reduced-precision vocabulary matmul.
REFINED_CANDIDATES = 8


@dataclass
class GreedyTail:
    """What csrc/lm_head.c's `greedy_head_bf16` takes besides the rows: the ranking
    weight's table, the dense bfloat16 weight [vocab, hidden], the refined candidates a row
    and the logits buffer (for the rows it was asked for)."""

    matrix: StackMatrix
    weight: torch.Tensor
    k: int
    scratch: torch.Tensor


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
        if tie_to is not None:
            # The same Parameter object: loading or casting one updates both.
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(
                torch.empty(num_embeddings, embedding_dim), requires_grad=False
            )
            self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]
        # How logits are computed (chosen after loading), and a cheaper copy for steps that
        # only need each row's argmax (None: the same method serves those).
        self.method: LinearMethod = DenseMethod(self.weight)
        self.shortlist: LinearMethod | None = None
        # The C greedy tail's table of the ranking weight, built on first use (the method
        # it points into, its table, the largest step it serves or None: every step).
        self._greedy_table: tuple[LinearMethod, StackMatrix | None, int | None] | None = None
        # The C greedy tail's logits buffer, kept across steps and grown as needed: a fresh
        # one each step (33.5 MB at Gemma's vocabulary and 64 rows) faulted its pages in.
        self._greedy_scratch: torch.Tensor | None = None

    def process_weights_after_loading(
        self, quantization: str | None = None, keep_dense: bool = True
    ) -> None:
        """Choose the head's methods (layers/quantization/selection.py): int8 whenever the
        body is quantized, whatever its `quantization` (the vocabulary projection decides
        the token directly, and GGUF files keep it at 8 bits: a Q8_0 matrix is taken with
        its own codes); where the byte kernels run and with `keep_dense`, also a 4-bit
        shortlist for argmax-only steps, and the dense weight for the step sizes where it
        wins. The dense weight itself always
        stays: a tied embedding reads it, and the top candidates are refined from it."""
        codes = getattr(self.weight, "file_codes", None)
        if codes is not None:  # GGUF codes (loaded by default_weight_loader), used once
            del self.weight.file_codes  # type: ignore[attr-defined]
        self.method, self.shortlist = select_lm_head_methods(
            self.weight, codes, WeightPlan(quantization, keep_dense)
        )

    @property
    def quantized(self) -> LinearMethod | None:
        """The quantized weight logits run on (None: dense); a view of the method."""
        return self.method.quantized_part()

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
        if logits.dtype == torch.float32 and self.method.is_dense:
            return logits
        candidates, exact = self._refine_top_candidates(hidden_states, logits)
        return logits.float().scatter_(1, candidates, exact)

    def greedy_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, embedding_dim] → [N] int64: the argmax of `forward(..., ranking_only=True)`,
        taken among the refined top candidates straight from the model-dtype logits: no
        [N, vocab] float32 copy, scatter or second pass over the vocabulary (for a 262k
        vocabulary those cost more than the matmul itself). Where the ranking weight is a
        byte dot-product one, the whole tail is one C call (csrc/lm_head.c).

        A row whose hidden state holds a NaN or infinity gets -1 (no token can be chosen
        from it): the sampler fails its request without a finiteness pass of its own."""
        tail = self.greedy_tail(hidden_states)
        if tail is not None:
            return cpu_ops.greedy_head(tail.matrix, hidden_states, tail.weight, tail.k,
                                       tail.scratch)
        logits = self._raw_logits(hidden_states, ranking_only=True)
        if logits.dtype == torch.float32 and self.method.is_dense:
            tokens = logits.argmax(dim=-1)
        else:
            candidates, exact = self._refine_top_candidates(hidden_states, logits)
            tokens = candidates.gather(1, exact.argmax(dim=-1, keepdim=True)).squeeze(1)
        return mark_nonfinite_rows(tokens, hidden_states)

    def greedy_tail(self, hidden_states: torch.Tensor) -> GreedyTail | None:
        """`greedy_tokens`' one C call as a caller that makes it itself takes it (csrc/
        decode_loop.c), for rows like `hidden_states`; None where that call does not serve
        them (then `greedy_tokens` takes its other ways)."""
        matrix = self._greedy_kernel(hidden_states)
        if matrix is None:
            return None
        scratch = self._scratch_for(matrix, hidden_states.shape[0])
        return GreedyTail(matrix, self.weight, REFINED_CANDIDATES, scratch)

    def _scratch_for(self, matrix: StackMatrix, num_rows: int) -> torch.Tensor:
        """The greedy tail's logits buffer for `num_rows` rows (grown, never shrunk)."""
        needed = cpu_ops.greedy_head_scratch_size(matrix, num_rows, self.num_embeddings)
        if self._greedy_scratch is None or self._greedy_scratch.numel() < needed:
            self._greedy_scratch = None  # the old one freed before the new one is taken
            self._greedy_scratch = torch.empty(needed, dtype=torch.bfloat16)
        return self._greedy_scratch

    def _raw_logits(self, hidden_states: torch.Tensor, ranking_only: bool) -> torch.Tensor:
        """[N, vocab] logits from the head's method for this step, in its own dtype."""
        method = self.shortlist if ranking_only and self.shortlist is not None else self.method
        return method.apply(hidden_states, None)

    def _ranking_method(self) -> LinearMethod:
        return self.shortlist if self.shortlist is not None else self.method

    def _greedy_kernel(self, hidden: torch.Tensor) -> StackMatrix | None:
        """The ranking weight's table when the C greedy tail serves this step: bfloat16
        rows and dense head on the host, a byte dot-product weight for this step size."""
        if not (self._refines_in_c(hidden) and self.num_embeddings >= REFINED_CANDIDATES):
            return None
        method = self._ranking_method()
        if self._greedy_table is None or self._greedy_table[0] is not method:
            found = method_kernel_parts(method.base_method())
            rows = self.weight.shape[0]
            if found is not None and any(part.out_features != rows for part in found[0]):
                found = None  # the C tail reads the dense weight's rows as the vocabulary
            table = None if found is None else parts_matrix(found[0])
            self._greedy_table = (method, table, None if found is None else found[1])
        _, table, limit = self._greedy_table
        return table if limit is None or hidden.shape[0] <= limit else None

    def _refines_in_c(self, hidden: torch.Tensor) -> bool:
        """Whether csrc/lm_head.c can refine: bfloat16 hidden rows and dense weight on the
        host (the fused ops on)."""
        weight = self.weight
        return (
            cpu_ops.serves(hidden)
            and weight.dtype == torch.bfloat16
            and weight.is_cpu
            and weight.dim() == 2
            and weight.is_contiguous()
        )

    def _refine_top_candidates(
        self, hidden: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's top REFINED_CANDIDATES token ids [N, k] and their float32 logits
        (in one C call where it serves, else torch's top-k, gather and bmm)."""
        k = min(REFINED_CANDIDATES, logits.shape[-1])
        if logits.dtype == torch.bfloat16 and logits.stride(-1) == 1 and self._refines_in_c(
            hidden
        ):
            return cpu_ops.refine_top(logits, hidden, self.weight, k)
        candidates = logits.topk(k, dim=-1).indices  # [N, k]; bf16 → f32 keeps the order
        rows = self.weight[candidates].float()  # [N, k, embedding_dim]
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)  # [N, k]
        return candidates, exact
