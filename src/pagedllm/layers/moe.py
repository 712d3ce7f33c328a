"""Sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE): top-k routing, then each
expert's gated MLP over exactly the tokens routed to it.

Tokens are grouped by expert with one sort of the (token, choice) pairs, so the work is one
matmul chain per expert that has tokens, never a loop over tokens. The experts are ordinary
fused `Linear` layers, so weight-only quantization (the W4A8 CPU kernels) applies to them as
to any other matrix. The router stays dense: routing is a discrete choice, and a quantized
router would send tokens to other experts.

Under tensor parallelism every rank routes alike (the router is replicated) and either holds
a slice of every expert (their gate/up split by columns, down by rows) or, with
`enable_expert_parallel`, a contiguous share of whole experts; either way each rank sums
what it holds into a partial output and one all-reduce per layer joins them (the shared
expert is split like a dense MLP and joins the same sum).
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.distributed.parallel_state import (
    expert_parallel_enabled,
    get_tp_group,
    single_rank_group,
)
from pagedllm.distributed.sharding import vocab_shard
from pagedllm.layers import cpu_ops
from pagedllm.layers.cpu_tables import MoETable, moe_table
from pagedllm.layers.linear import Linear
from pagedllm.layers.missing import MissingLayer
from pagedllm.layers.mlp import GatedMLP

# Steps of at most this many rows run the whole layer in one C call (csrc/moe.c) when the
# weights allow (bfloat16 on CPU, byte dot-product experts, one rank): its router runs in
# float32 C loops, cheaper than torch's calls for a few rows, not for a long prefill. The
# decode stack takes MoE models' steps only up to this size, so both paths agree.
MOE_KERNEL_MAX_ROWS = 64


class RouterLinear(Linear):
    """The router's [num_experts, hidden] projection: never quantized (see the module doc)."""

    quantizable = False


class FusedMoE(nn.Module):
    """Route each token to its `top_k` experts and sum their outputs by routing weight.

    Routing as in transformers: softmax over the router logits in float32, top-k, optionally
    renormalised to sum to one, then cast to the activations' dtype. With
    `shared_intermediate_size` (Qwen2-MoE) a shared expert that every token uses is added,
    scaled by sigmoid(shared_expert_gate(x)).
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        activation: str = "silu",
        shared_intermediate_size: int = 0,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = RouterLinear(hidden_size, num_experts)
        self.tp_group = get_tp_group()
        expert_group = self.tp_group
        self.local_experts = range(num_experts)
        if expert_parallel_enabled() and self.tp_group.world_size > 1:
            # Whole experts, a contiguous share per rank (the shard arithmetic of a vocabulary).
            self.local_experts = vocab_shard(
                num_experts, self.tp_group.world_size, self.tp_group.rank_in_group
            )
            expert_group = single_rank_group()
        self.experts = nn.ModuleList(
            GatedMLP(hidden_size, intermediate_size, activation=activation,
                     tp_group=expert_group, reduce_results=False)
            if expert in self.local_experts else MissingLayer()
            for expert in range(num_experts)
        )
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: RouterLinear | None = None
        if shared_intermediate_size:
            self.shared_expert = GatedMLP(
                hidden_size, shared_intermediate_size, activation=activation,
                reduce_results=False,
            )
            self.shared_expert_gate = RouterLinear(hidden_size, 1)

    def kernel_table(self) -> MoETable | None:
        """This layer's table for csrc/moe.c (built once, on first use: after the weights
        took their final form), or None where the C kernel cannot run it. It points into
        the experts' weights: code that replaces them must drop `_kernel_table`."""
        if not hasattr(self, "_kernel_table"):
            self._kernel_table = moe_table(self)
        return self._kernel_table

    def _kernel_serves(self, x: torch.Tensor) -> MoETable | None:
        if not cpu_ops.serves(x) or not 0 < x.shape[0] <= MOE_KERNEL_MAX_ROWS:
            return None
        table = self.kernel_table()
        if table is None or (table.max_tokens is not None and x.shape[0] > table.max_tokens):
            return None
        return table

    def holds_expert(self, expert: int) -> bool:
        """True when this rank holds (a slice of) `expert`."""
        return expert in self.local_experts

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, top_k] in x's dtype, expert ids [T, top_k]) of each token."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E]
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] → [T, hidden]: the routed experts' outputs, weighted and summed
        (plus the gated shared expert's); a small bfloat16 step on CPU in one C call."""
        table = self._kernel_serves(x)
        if table is not None:
            return cpu_ops.moe(table.table, table.activation, x)
        out = self._routed(x)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out += self.shared_expert(x) * torch.sigmoid(self.shared_expert_gate(x))
        return self.tp_group.all_reduce(out)  # the ranks' partial sums (one rank: as is)

    def _routed(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        flat_ids = ids.view(-1)  # [T * top_k], choice c of token t at t * top_k + c
        order = torch.argsort(flat_ids, stable=True)  # choices grouped by expert
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        token_of = order // self.top_k  # [T * top_k] token of each grouped choice
        grouped = x.index_select(0, token_of)  # [T * top_k, hidden]
        holds_all = len(self.local_experts) == self.num_experts
        out = torch.empty_like(grouped) if holds_all else torch.zeros_like(grouped)
        start = 0
        for index, count in enumerate(counts):
            if count and index in self.local_experts:
                # One chain of matmuls over all the tokens this expert serves.
                out[start : start + count] = self.experts[index](grouped[start : start + count])
            start += count  # another rank's expert: its rows stay zero here
        out.mul_(weights.view(-1).index_select(0, order).unsqueeze(1))
        return torch.zeros_like(x).index_add_(0, token_of, out)
