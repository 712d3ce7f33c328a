"""A draft model: any registered architecture sharing the target's tokenizer, with its own
paged KV cache (same block ids as the target's, spec_decode/draft_kv.py).

It runs only for the requests it proposes for. Each time it first catches up on the tokens
it has not seen (the whole history on a request's first proposal, else the tokens accepted
and emitted since its last one: one forward pass over every row), then guesses k - 1 more
tokens one position at a time. The KV of its own guesses is never counted as computed, so
rejected drafts need no rollback here; preempted or finished requests start over.

Drafts are the draft model's argmax for greedy and seeded requests (verified by matching)
and a sample from its temperature-scaled distribution for the others, whose distribution
goes to the rejection sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch

from pagedllm.layers.forward_context import set_forward_context
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.draft_kv import (
    DraftBatch,
    allocate_kv_caches,
    capacity,
    forward_context,
)
from pagedllm.spec_decode.proposers import DrafterContext, Proposal, ProposalInputs

if TYPE_CHECKING:
    from pagedllm.models.interfaces import CausalLM


class DraftModelProposer:
    """Proposes k tokens per request by running a small model autoregressively."""

    def __init__(self, config: SpeculativeConfig, context: DrafterContext) -> None:
        from pagedllm.model_loader.loader import get_model

        assert context.model_config is not None, "the engine args resolve the draft model"
        self.context = context
        self.k = config.num_speculative_tokens
        module = get_model(context.model_config, str(context.device))
        self.model = cast("CausalLM", module)
        hf = context.model_config.hf_config
        num_kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        head_size = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        self.kv_caches = allocate_kv_caches(
            context, hf.num_hidden_layers, num_kv_heads, head_size
        )
        # Its steps of one token a row take the platform's fast path where one serves.
        self.decode_step = None
        if context.decode_step_for is not None:
            self.decode_step = context.decode_step_for(module, self.kv_caches)
        # request id -> positions of its history whose KV this model holds.
        self.computed: dict[str, int] = {}

    def forget(self, request_ids: Sequence[str]) -> None:
        """Finished or preempted requests start over (their blocks are gone)."""
        for request_id in request_ids:
            self.computed.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, inputs: ProposalInputs) -> Proposal:
        """Catch up on each proposing row's new tokens, then guess k tokens."""
        rows = inputs.propose_rows
        if not rows:
            return Proposal([], [])
        ids = [inputs.request_ids[r] for r in rows]
        tokens = [inputs.token_ids[r] for r in rows]
        tables = [inputs.block_tables[r] for r in rows]
        params = [inputs.sampling_params[r] for r in rows]
        starts = [min(self.computed.get(i, 0), len(t) - 1) for i, t in zip(ids, tokens,
                                                                           strict=True)]
        batch = DraftBatch.build([t[s:] for t, s in zip(tokens, starts, strict=True)], starts,
                                 tables)
        logits = self._forward(batch)  # [R, vocab] at each row's last token
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        active = list(range(len(rows)))
        positions = [len(t) for t in tokens]  # where each row's next draft goes
        for step in range(self.k):
            chosen = self._choose(logits, [params[i] for i in active], [probs[i] for i in active])
            for i, token in zip(active, chosen, strict=True):
                drafts[i].append(token)
            # Guess further only where the next position has a slot (the lookahead).
            active = [
                i for i in active
                if step + 1 < self.k and positions[i] < capacity(tables[i], self.context.block_size)
            ]  # fmt: skip
            if not active:
                break
            batch = DraftBatch.build(
                [[drafts[i][-1]] for i in active], [positions[i] for i in active],
                [tables[i] for i in active],
            )
            for i in active:
                positions[i] += 1
            logits = self._forward(batch)
        for request_id, token_list in zip(ids, tokens, strict=True):
            # The last token's KV may sit in a lookahead block the scheduler frees.
            self.computed[request_id] = len(token_list) - 1
        return Proposal(
            drafts, [torch.stack(p) if p else None for p in probs]
        )

    def _forward(self, batch: DraftBatch) -> torch.Tensor:
        """The draft model's logits at each row's last token, [rows, vocab] float32."""
        device = self.context.device
        hidden = self._fast_path(batch)
        if hidden is None:
            with set_forward_context(forward_context(self.context, batch, self.kv_caches)):
                hidden = self.model.forward(
                    torch.from_numpy(batch.input_ids).to(device),
                    torch.from_numpy(batch.positions).to(device),
                )
        last = torch.from_numpy(batch.last_token_indices).to(device)
        return self.model.compute_logits(hidden[last]).float()

    def _fast_path(self, batch: DraftBatch) -> torch.Tensor | None:
        """The hidden states from the decode-step fast path, for a step of one token a row
        it serves; else None."""
        if self.decode_step is None or not bool((batch.query_lens == 1).all()):
            return None
        table, slots = batch.table_and_slots(self.context.block_size)
        return self.decode_step(batch.input_ids, batch.positions, slots, table)

    @staticmethod
    def _choose(
        logits: torch.Tensor, params: list, probs: list[list[torch.Tensor]]
    ) -> list[int]:
        """Argmax for greedy and seeded rows, a temperature sample (recorded) otherwise."""
        chosen = logits.argmax(dim=-1).tolist()
        for i, p in enumerate(params):
            if p.is_greedy or p.seed is not None:
                continue
            distribution = torch.softmax(logits[i] / p.temperature, dim=-1)
            chosen[i] = int(torch.multinomial(distribution, 1))
            probs[i].append(distribution)
        return chosen
