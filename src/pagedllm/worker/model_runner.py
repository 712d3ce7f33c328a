"""ModelRunner: turns a SchedulerOutput into one batched forward pass and sampled tokens.

It applies the scheduler's diff to its own per-request state, flattens the scheduled tokens
of all requests (prefill chunks and decodes alike) into one batch, builds the attention
metadata once, runs the model inside the forward context, computes logits only at positions
that sample, and samples. It never touches scheduling state: its answer is plain lists.

Logprobs are the model's raw distribution (log_softmax of the logits, before penalties and
temperature): for the sampled token of rows that ask (`logprobs`), and for prompt tokens
(`prompt_logprobs`) from the hidden states of the prompt positions computed each step,
accumulated over chunks and sent once the prompt is done.

Pooling requests (embeddings, class scores) ride in the same batch: their rows are pooled by
the ModelPooler (pooling/model_pooler.py) instead of sampled. An encoder model (BERT) has no
KV cache: its steps hold pooling requests only, run with bidirectional attention over the
packed sequences, without block tables.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata
from pagedllm.core.kv_cache_groups import KVCacheGroupSpec
from pagedllm.core.sched_output import NewRequestData, SchedulerOutput
from pagedllm.distributed.parallel_state import get_pp_group, get_tp_group
from pagedllm.distributed.pipeline import IntermediateTensors
from pagedllm.layers.forward_context import ForwardContext, set_forward_context
from pagedllm.layers.logprobs import compute_token_logprobs
from pagedllm.layers.sampler import Sampler, SamplingMetadata
from pagedllm.logger import init_logger
from pagedllm.pooling.config import PoolerConfig
from pagedllm.pooling.data import PooledData
from pagedllm.pooling.model_pooler import ModelPooler, PoolingSpan
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.proposers import ProposalInputs, Proposer
from pagedllm.spec_decode.rejection_sampler import DraftLayout, RejectionSampler, accept_greedy
from pagedllm.spec_decode.verify import (
    AttentionRows,
    build_verify_metadata,
    split_verify_rows,
)
from pagedllm.structured_output.bitmask import apply_grammar_bitmask
from pagedllm.worker.block_table import (
    compute_slot_mapping,
    make_block_table_array,
    null_skipped_blocks,
)
from pagedllm.worker.cuda_graphs import DecodeGraphs
from pagedllm.worker.input_batch import CachedRequestState, StepInputs
from pagedllm.worker.logprobs import (
    concat_token_logprobs,
    plan_prompt_logprobs,
    resolve_num_top,
    split_logprobs,
)
from pagedllm.worker.nonfinite import finite_rows, nonfinite_rows, owners_of_rows
from pagedllm.worker.outputs import LogprobsLists, ModelRunnerOutput

if TYPE_CHECKING:
    from pagedllm.lora.manager import LoRAModelManager
    from pagedllm.models.interfaces import CausalLM

logger = init_logger(__name__)

# Prompt positions scored per logits computation: bounds the [M, vocab] float32 temporaries.
_PROMPT_LOGPROBS_CHUNK = 256


class ModelRunner:
    """Runs the model for the requests the scheduler chose.

    Args:
        model: a CausalLM (see models/interfaces.py) on `device`.
        backend: the attention backend.
        kv_caches: one KV tensor per layer, in the backend's layout.
        block_size: tokens per KV block.
        device: torch device of the model.
        kv_cache_groups: the KV cache groups, each with its own block table per request
            (None: one full-attention group of every layer).
        pooler_config: how pooling requests are pooled (None: LAST-token, no defaults).
        speculative_config: speculative decoding (None: off).
        proposer: its proposer of draft tokens (built by the worker).
        lora_manager: the model's LoRA adapter slots (None: LoRA off).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        block_size: int,
        device: torch.device,
        kv_cache_groups: tuple[KVCacheGroupSpec, ...] | None = None,
        pooler_config: PoolerConfig | None = None,
        speculative_config: SpeculativeConfig | None = None,
        proposer: Proposer | None = None,
        lora_manager: LoRAModelManager | None = None,
        activation_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model
        self.activation_dtype = activation_dtype
        self.tp_group, self.pp_group = get_tp_group(), get_pp_group()
        self.is_driver = self.tp_group.is_first_rank and self.pp_group.is_last_rank
        self.tokens_from_scheduler = self.tp_group.world_size * self.pp_group.world_size > 1
        # What a pipeline stage receives per token (decoders built from a DecoderSpec).
        spec = getattr(model, "spec", None)
        self._hidden_size = int(spec.hidden_size) if spec is not None else 0
        # An encoder takes the packed sequences' lengths instead of a KV cache.
        self.is_encoder = bool(getattr(model, "is_encoder", False))
        self.pooler = ModelPooler(model, pooler_config or PoolerConfig())
        # The same object, typed as what the runner calls on it beyond forward().
        self._causal_lm = cast("CausalLM", model)
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.kv_cache_groups = kv_cache_groups or (
            KVCacheGroupSpec(tuple(range(len(kv_caches)))),
        )
        self._group_of_layer = [0] * len(kv_caches)
        for group_id, group in enumerate(self.kv_cache_groups):
            for layer_index in group.layer_indices:
                self._group_of_layer[layer_index] = group_id
        self.sampler = Sampler()
        self.speculative_config = speculative_config
        self.proposer = proposer
        self.lora_manager = lora_manager
        self.rejection_sampler = RejectionSampler()
        # request id -> [drafts, vocab] the distribution its pending drafts were drawn from.
        self._draft_probs: dict[str, torch.Tensor] = {}
        self.requests: dict[str, CachedRequestState] = {}
        # Prompt logprobs of requests swapped out mid-prompt, until they are swapped back in.
        self._parked_prompt_logprobs: dict[str, LogprobsLists] = {}
        # Captured decode forwards (CUDA graphs), set by the worker where they serve.
        self.decode_graphs: DecodeGraphs | None = None

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and return the sampled tokens per request."""
        self._update_states(scheduler_output)
        if scheduler_output.is_empty:
            return ModelRunnerOutput(request_ids=[], sampled_token_ids=[])
        inputs = self._prepare_inputs(scheduler_output)
        hidden_states = self._forward(inputs)
        if hidden_states is None:  # a pipeline stage before the last: passed on
            return ModelRunnerOutput(request_ids=[], sampled_token_ids=[])
        pooler_output = self._pool(inputs, hidden_states)
        # Before sampling: _make_output appends the sampled tokens to the states.
        prompt_logprobs = self._compute_prompt_logprobs(inputs, hidden_states)
        sampled, logprobs, failed = self._sample(inputs, hidden_states, scheduler_output)
        output = self._make_output(inputs, sampled)
        output.spec_token_ids = self._propose(inputs, hidden_states, sampled)
        output.logprobs = logprobs
        output.prompt_logprobs = prompt_logprobs
        output.pooler_output = pooler_output
        if failed:
            self._fail_rows(inputs, output, failed)
        return output

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        self._drop_requests(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.request_id] = CachedRequestState(
                request_id=new.request_id,
                token_ids=list(new.prompt_token_ids) + list(new.output_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                sampling_params=new.sampling_params,
                eos_token_id=new.eos_token_id,
                block_ids=[list(table) for table in new.block_ids],
                num_computed_tokens=new.num_computed_tokens,
                in_progress_prompt_logprobs=self._start_prompt_logprobs(new),
                pooling_params=new.pooling_params,
                token_type_ids=new.token_type_ids,
                lora_request=new.lora_request,
            )
        cached = scheduler_output.scheduled_cached_reqs
        num_blocks_kept = cached.num_blocks_kept or [None] * cached.num_requests
        for request_id, new_block_ids, num_computed, num_kept in zip(
            cached.request_ids,
            cached.new_block_ids,
            cached.num_computed_tokens,
            num_blocks_kept,
            strict=True,
        ):
            state = self.requests[request_id]
            for table, new_ids in zip(state.block_ids, new_block_ids, strict=True):
                if num_kept is not None:
                    del table[num_kept:]  # blocks of rejected drafts, freed
                table.extend(new_ids)
            state.num_computed_tokens = num_computed
        if not cached.new_token_ids:
            return  # one rank: it appended its own samples
        for request_id, num_computed, token_ids in zip(
            cached.request_ids, cached.num_computed_tokens, cached.new_token_ids, strict=True
        ):
            if token_ids:  # sampled in earlier steps, on the rank that samples
                state = self.requests[request_id]
                del state.token_ids[max(num_computed, state.num_prompt_tokens):]
                state.token_ids.extend(token_ids)

    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> StepInputs:
        request_ids = list(scheduler_output.num_scheduled_tokens)
        states = [self.requests[rid] for rid in request_ids]
        query_lens = np.array(
            [scheduler_output.num_scheduled_tokens[rid] for rid in request_ids], dtype=np.int64
        )
        context_lens = np.array([s.num_computed_tokens for s in states], dtype=np.int64)
        query_start_loc = np.zeros(len(states) + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        # Position of every token: its request's context length plus its offset in the query.
        req_indices = np.repeat(np.arange(len(states)), query_lens)
        offsets = np.arange(num_tokens) - np.repeat(query_start_loc[:-1], query_lens)
        positions = context_lens[req_indices] + offsets
        drafts_of = scheduler_output.scheduled_spec_decode_tokens
        slices = zip(states, context_lens, query_lens, strict=True)
        input_ids = np.fromiter(
            (
                t
                for s, c, q in slices
                for t in (
                    s.token_ids[c : c + q]
                    if s.request_id not in drafts_of
                    else s.token_ids[c:] + drafts_of[s.request_id]
                )
            ),
            dtype=np.int64,
            count=num_tokens,
        )
        block_tables, slot_mappings = [], []
        for group_id, group in enumerate(self.kv_cache_groups if not self.is_encoder else ()):
            table = make_block_table_array([s.block_ids[group_id] for s in states])
            slot_mappings.append(
                compute_slot_mapping(table, req_indices, positions, self.block_size)
            )
            if group.sliding_window is not None:
                null_skipped_blocks(table, context_lens, group.sliding_window, self.block_size)
            block_tables.append(table)
        ends = context_lens + query_lens
        pooling_rows = [i for i, s in enumerate(states) if s.pooling_params is not None]
        sample_rows = [
            i for i, s in enumerate(states)
            if ends[i] >= s.num_tokens and s.pooling_params is None
        ]  # fmt: skip
        return StepInputs(
            request_ids=request_ids,
            input_ids=input_ids,
            positions=positions,
            slot_mappings=slot_mappings,
            query_start_loc=query_start_loc,
            query_lens=query_lens,
            context_lens=context_lens,
            block_tables=block_tables,
            sample_rows=sample_rows,
            pooling_rows=pooling_rows,
            draft_token_ids=[drafts_of.get(request_ids[i], []) for i in sample_rows],
        )

    def _forward(self, inputs: StepInputs) -> torch.Tensor | None:
        """The last hidden states; None on a pipeline stage before the last (its residual
        stream went to the next stage)."""
        if self.is_encoder:
            return self._forward_encoder(inputs)
        if self.lora_manager is not None:  # group the step's tokens by adapter
            self.lora_manager.prepare_step(
                [
                    (self.requests[rid].lora_request, int(q))
                    for rid, q in zip(inputs.request_ids, inputs.query_lens, strict=True)
                ],
                self.device,
            )
        rows = self._attention_rows(inputs)
        graphs = self.decode_graphs
        if graphs is not None and graphs.serves(  # (never built with speculative decoding)
            rows.query_lens, rows.block_tables[0].shape[1]
        ):
            return graphs.run(
                inputs.input_ids, inputs.positions, inputs.slot_mapping, rows.block_tables[0]
            )
        common = self._build_common_metadata(inputs, rows)
        group_metadata = [self.backend.build_metadata(common, self.block_size)]
        for table, slots in zip(rows.block_tables[1:], inputs.slot_mappings[1:], strict=True):
            group_common = dataclasses.replace(
                common, block_tables=self._to_device(table), slot_mapping=self._to_device(slots)
            )
            group_metadata.append(self.backend.build_metadata(group_common, self.block_size))
        layer_metadata = None
        if len(group_metadata) > 1:
            layer_metadata = [group_metadata[g] for g in self._group_of_layer]
        context = ForwardContext(
            self.backend, group_metadata[0], self.kv_caches, layer_metadata
        )
        input_ids, positions = (
            self._to_device(inputs.input_ids), self._to_device(inputs.positions)
        )
        if self.pp_group.world_size == 1:
            with set_forward_context(context):
                return self.model(input_ids, positions)  # [num_tokens, hidden_size]
        return self._forward_stage(context, input_ids, positions)

    def _forward_stage(
        self, context: ForwardContext, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | None:
        """One pipeline stage: from the previous stage's residual stream (but the first),
        to the next stage (but the last, which returns the hidden states)."""
        intermediate = None
        if not self.pp_group.is_first_rank:
            intermediate = IntermediateTensors.recv(
                self.pp_group, input_ids.shape[0], self._hidden_size,
                self.activation_dtype, self.device,
            )
        with set_forward_context(context):
            output = self.model(input_ids, positions, intermediate)
        if isinstance(output, IntermediateTensors):
            output.send(self.pp_group, self.activation_dtype)
            return None
        return output

    def _forward_encoder(self, inputs: StepInputs) -> torch.Tensor:
        """Bidirectional attention over the packed sequences; nothing is cached."""
        states = [self.requests[rid] for rid in inputs.request_ids]
        token_type_ids = None
        if any(s.token_type_ids is not None for s in states):
            token_type_ids = self._to_device(np.concatenate([
                np.asarray(s.token_type_ids or [0] * s.num_tokens, dtype=np.int64)
                for s in states
            ]))  # fmt: skip
        return self.model(
            self._to_device(inputs.input_ids),
            self._to_device(inputs.positions),
            inputs.query_lens.tolist(),
            token_type_ids,
        )  # [num_tokens, hidden_size]

    def _pool(
        self, inputs: StepInputs, hidden_states: torch.Tensor
    ) -> dict[str, PooledData]:
        """The pooled outputs of this step's pooling requests, by request id."""
        if not inputs.pooling_rows:
            return {}
        spans = [
            PoolingSpan(
                inputs.request_ids[row],
                int(inputs.query_start_loc[row]),
                int(inputs.query_lens[row]),
                self.requests[inputs.request_ids[row]].pooling_params,  # type: ignore[arg-type]
            )
            for row in inputs.pooling_rows
        ]
        return self.pooler(hidden_states, self._to_device(inputs.input_ids), spans)

    @staticmethod
    def _attention_rows(inputs: StepInputs) -> AttentionRows:
        """The batch as attention sees it: verifications as decode rows
        (spec_decode/verify.py), every other request as one row."""
        if inputs.has_drafts:
            return split_verify_rows(
                inputs.query_lens, inputs.context_lens, inputs.block_tables, inputs.num_drafts
            )
        return AttentionRows(
            inputs.query_start_loc, inputs.query_lens, inputs.context_lens, inputs.block_tables
        )

    def _build_common_metadata(
        self, inputs: StepInputs, rows: AttentionRows
    ) -> CommonAttentionMetadata:
        query_lens, context_lens = rows.query_lens, rows.context_lens
        query_start_loc, block_table = rows.query_start_loc, rows.block_tables[0]
        seq_lens = context_lens + query_lens
        return CommonAttentionMetadata(
            num_reqs=len(query_lens),
            num_tokens=len(inputs.input_ids),
            query_start_loc=self._to_device(query_start_loc),
            query_lens=self._to_device(query_lens),
            context_lens=self._to_device(context_lens),
            seq_lens=self._to_device(seq_lens),
            max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_tables=self._to_device(block_table),
            slot_mapping=self._to_device(inputs.slot_mapping),
            query_lens_cpu=query_lens.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
            contexts_rewritten=self.speculative_config is not None,
        )

    def _sample(
        self, inputs: StepInputs, hidden_states: torch.Tensor, scheduler_output: SchedulerOutput
    ) -> tuple[list[list[int]], dict[str, LogprobsLists], list[int]]:
        """The tokens each sample row emits this step, their logprobs where asked, and the
        sample rows (indices into `inputs.sample_rows`) whose forward was not finite."""
        if not inputs.sample_rows:
            return [], {}, []
        if inputs.has_drafts:
            return self._verify(inputs, hidden_states, scheduler_output)
        constrained = scheduler_output.structured_output_request_ids
        states = [self.requests[inputs.request_ids[row]] for row in inputs.sample_rows]
        metadata = SamplingMetadata.build(
            [s.sampling_params for s in states],
            [s.num_output_tokens for s in states],
            [s.eos_token_id for s in states],
            self.device,
            token_ids=[s.token_ids for s in states],
            num_prompt_tokens=[s.num_prompt_tokens for s in states],
        )
        # Plain greedy rows without logprobs use nothing but the argmax.
        # (A grammar may forbid every shortlisted candidate: constrained steps need all logits.)
        ranking_only = (
            metadata.all_greedy
            and metadata.logits_processors is None
            and not constrained
            and all(s.sampling_params.logprobs is None for s in states)
        )
        sample_hidden = hidden_states[self._to_device(inputs.logits_indices)]
        finite = finite_rows(sample_hidden)
        if ranking_only and metadata.min_tokens_mask is None:
            # Nothing but each row's argmax is used: the LM head picks it directly. The
            # finiteness check is read after the tokens' copy: no extra sync on a device.
            tokens = self._causal_lm.compute_greedy_tokens(sample_hidden).tolist()
            return [[t] for t in tokens], {}, nonfinite_rows(finite)
        logits = self._causal_lm.compute_logits(sample_hidden, ranking_only)
        # Rows whose forward went non-finite get zero logits, on the device (no host sync
        # before sampling): finite values keep the sampler's math sound; their tokens are
        # dropped (`failed`, read after the tokens' copy).
        logits = logits.float().masked_fill_(~finite.unsqueeze(1), 0.0)  # [n, vocab]
        if constrained:
            row_of = {state.request_id: row for row, state in enumerate(states)}
            rows = [row_of[request_id] for request_id in constrained]
            apply_grammar_bitmask(logits, scheduler_output.grammar_bitmask, rows)
        if not self.is_driver:  # the driver samples (the logits above were collective)
            return [[] for _ in states], {}, []
        emitted = [[t] for t in self.sampler(logits, metadata).tolist()]  # one token a row
        failed = nonfinite_rows(finite)
        logprobs = self._emitted_logprobs(states, logits, list(range(len(states))), emitted)
        return emitted, logprobs, failed

    def _verify(
        self, inputs: StepInputs, hidden_states: torch.Tensor, scheduler_output: SchedulerOutput
    ) -> tuple[list[list[int]], dict[str, LogprobsLists], list[int]]:
        """Verify the drafts of the step: each row emits its accepted drafts plus one."""
        states = [self.requests[inputs.request_ids[row]] for row in inputs.sample_rows]
        drafts = inputs.draft_token_ids
        layout = DraftLayout.build(drafts)
        metadata = build_verify_metadata(
            [s.sampling_params for s in states],
            [s.num_output_tokens for s in states],
            [s.eos_token_id for s in states],
            [s.token_ids for s in states],
            [s.num_prompt_tokens for s in states],
            drafts,
            self.device,
        )
        constrained = scheduler_output.structured_output_request_ids
        asks_logprobs = any(s.sampling_params.logprobs is not None for s in states)
        verify_hidden = hidden_states[self._to_device(inputs.logits_indices)]
        finite = finite_rows(verify_hidden)
        if (
            metadata.all_greedy
            and metadata.logits_processors is None
            and metadata.min_tokens_mask is None
            and not constrained
            and not asks_logprobs
        ):
            tokens = self._causal_lm.compute_greedy_tokens(verify_hidden).tolist()
            bad_rows = nonfinite_rows(finite)
            failed = owners_of_rows(bad_rows, layout.row_starts) if bad_rows else []
            return accept_greedy(layout, tokens), {}, failed
        bad_rows = nonfinite_rows(finite)
        failed = owners_of_rows(bad_rows, layout.row_starts) if bad_rows else []
        logits = self._causal_lm.compute_logits(verify_hidden).float()
        if bad_rows:
            logits[bad_rows] = 0.0
        if constrained:  # a bitmask row for each position a constrained request verifies
            index = {s.request_id: i for i, s in enumerate(states)}
            rows = [
                int(layout.row_starts[index[request_id]]) + j
                for request_id in constrained
                for j in range(len(drafts[index[request_id]]) + 1)
            ]
            apply_grammar_bitmask(logits, scheduler_output.grammar_bitmask, rows)
        draft_probs = self._pending_draft_probs(states, drafts, logits.shape[-1])
        emitted = self.rejection_sampler(logits, metadata, layout, draft_probs)
        row_starts = layout.row_starts.tolist()
        return emitted, self._emitted_logprobs(states, logits, row_starts, emitted), failed

    def _pending_draft_probs(
        self, states: list[CachedRequestState], drafts: list[list[int]], vocab_size: int
    ) -> torch.Tensor | None:
        """[M, vocab] the drafter's distribution at every verified draft (one-hot where the
        drafts were deterministic); None when all were."""
        probs = [self._draft_probs.pop(s.request_id, None) for s in states]
        if all(p is None for p in probs):
            return None
        rows = []
        for p, request_drafts in zip(probs, drafts, strict=True):
            if not request_drafts:
                continue
            if p is None:  # deterministic drafts: all the mass on the draft
                p = torch.zeros(len(request_drafts), vocab_size, device=self.device)
                p[torch.arange(len(request_drafts)), torch.tensor(request_drafts)] = 1.0
            rows.append(p[: len(request_drafts)].float())  # the scheduler may cut drafts
        return torch.cat(rows)

    def _emitted_logprobs(
        self,
        states: list[CachedRequestState],
        logits: torch.Tensor,
        row_starts: list[int],
        emitted: list[list[int]],
    ) -> dict[str, LogprobsLists]:
        """Raw logprobs (+ top-k) of every emitted token at its own logits row (request i's
        tokens at rows row_starts[i], +1, ...), for the requests that ask; one
        log_softmax and one topk (k = the largest asked) over all of them."""
        asking = [i for i, s in enumerate(states) if s.sampling_params.logprobs is not None]
        if not asking:
            return {}
        vocab_size = logits.shape[-1]
        rows = [row_starts[i] + j for i in asking for j in range(len(emitted[i]))]
        tokens = [t for i in asking for t in emitted[i]]
        num_top = [
            resolve_num_top(states[i].sampling_params.logprobs or 0, vocab_size) for i in asking
        ]
        index = torch.tensor(rows, device=logits.device)
        token_tensor = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
        result = compute_token_logprobs(logits[index], token_tensor, max(num_top))
        lists = split_logprobs(result, [len(emitted[i]) for i in asking], num_top)
        return {states[i].request_id: lp for i, lp in zip(asking, lists, strict=True)}

    def _propose(
        self, inputs: StepInputs, hidden_states: torch.Tensor, emitted: list[list[int]]
    ) -> dict[str, list[int]]:
        """Draft tokens for the next step of every request that sampled in this one."""
        if self.proposer is None:
            return {}
        assert self.speculative_config is not None
        propose_rows = list(inputs.sample_rows)
        if len(propose_rows) > self.speculative_config.max_batch_size:
            propose_rows = []  # a compute-bound batch: verifying costs what it saves
        states = [self.requests[request_id] for request_id in inputs.request_ids]
        num_kept = inputs.query_lens.copy()
        for row, drafts, tokens in zip(
            inputs.sample_rows, inputs.draft_token_ids, emitted, strict=True
        ):
            num_kept[row] -= len(drafts) - (len(tokens) - 1)  # the rejected drafts
        proposal = self.proposer.propose(ProposalInputs(
            request_ids=inputs.request_ids,
            token_ids=[s.token_ids for s in states],
            context_lens=inputs.context_lens,
            num_kept=num_kept,
            query_start_loc=inputs.query_start_loc,
            block_tables=[s.block_ids[0] if s.block_ids else [] for s in states],
            sampling_params=[s.sampling_params for s in states],
            propose_rows=propose_rows,
            hidden_states=hidden_states,
            is_pooling=[s.pooling_params is not None for s in states],
        ))
        result: dict[str, list[int]] = {}
        for row, drafts, probs in zip(propose_rows, proposal.drafts, proposal.probs, strict=True):
            request_id = inputs.request_ids[row]
            if drafts:
                result[request_id] = drafts
                if probs is not None:
                    self._draft_probs[request_id] = probs
        return result

    def _compute_prompt_logprobs(
        self, inputs: StepInputs, hidden_states: torch.Tensor
    ) -> dict[str, LogprobsLists]:
        """Score this step's prompt positions; return the prompts completed this step."""
        states = [self.requests[rid] for rid in inputs.request_ids]
        plan = plan_prompt_logprobs(inputs, states)
        if plan is None:
            return {}
        num_scored = len(plan.hidden_indices)
        results = []
        vocab_size = 0
        for start in range(0, num_scored, _PROMPT_LOGPROBS_CHUNK):
            end = min(start + _PROMPT_LOGPROBS_CHUNK, num_scored)
            index = self._to_device(plan.hidden_indices[start:end])
            logits = self._causal_lm.compute_logits(hidden_states[index])  # [m, vocab]
            vocab_size = logits.shape[-1]
            max_top = max(resolve_num_top(n, vocab_size) for n in plan.num_logprobs)
            targets = self._to_device(plan.target_ids[start:end])  # [m]
            results.append(compute_token_logprobs(logits, targets, max_top))
        num_top = [resolve_num_top(n, vocab_size) for n in plan.num_logprobs]
        if results:
            lists = split_logprobs(concat_token_logprobs(results), plan.num_positions, num_top)
        else:  # only prompts of one token, or chunks ending at the last prompt token
            lists = [LogprobsLists() for _ in plan.rows]
        completed: dict[str, LogprobsLists] = {}
        for row, scored, is_complete in zip(plan.rows, lists, plan.is_complete, strict=True):
            state = states[row]
            accumulated = state.in_progress_prompt_logprobs
            assert accumulated is not None
            accumulated.extend(scored)
            if is_complete:
                completed[state.request_id] = accumulated
                state.in_progress_prompt_logprobs = None
        return completed

    def _start_prompt_logprobs(self, new: NewRequestData) -> LogprobsLists | None:
        """The prompt-logprobs accumulator of a (re)admitted request, None if not needed."""
        parked = self._parked_prompt_logprobs.pop(new.request_id, None)
        if new.sampling_params.prompt_logprobs is None or new.output_token_ids:
            return None  # not asked for, or already sent before a preemption
        num_scored = min(new.num_computed_tokens, len(new.prompt_token_ids) - 1)
        if parked is not None and len(parked) == num_scored:
            return parked  # swapped back in mid-prompt: continue where it stopped
        # Positions already computed elsewhere (a prefix-cache hit, which
        # skip_reading_prefix_cache prevents) cannot be scored; the frontend leaves them None.
        return LogprobsLists()

    def _drop_requests(self, scheduler_output: SchedulerOutput) -> None:
        """Forget finished and preempted requests, parking mid-prompt logprobs of swaps."""
        swapped_out = {device for device, _ in scheduler_output.blocks_to_swap_out}
        if self.proposer is not None:
            self.proposer.forget(list(scheduler_output.finished_request_ids))
            for request_id in scheduler_output.finished_request_ids:
                self._draft_probs.pop(request_id, None)
        for request_id in scheduler_output.finished_request_ids:
            state = self.requests.pop(request_id, None)
            if state is None:
                # Ended while swapped out: its parked logprobs will never be resumed.
                self._parked_prompt_logprobs.pop(request_id, None)
                continue
            if state.in_progress_prompt_logprobs is None:
                continue
            # Only a swapped-out request comes back with its computed tokens; its blocks are
            # the ones being copied out this step.
            if any(swapped_out.intersection(table) for table in state.block_ids):
                self._parked_prompt_logprobs[request_id] = state.in_progress_prompt_logprobs

    def _make_output(self, inputs: StepInputs, sampled: list[list[int]]) -> ModelRunnerOutput:
        sampled_token_ids: list[list[int]] = [[] for _ in inputs.request_ids]
        for row, token_ids in zip(inputs.sample_rows, sampled, strict=True):
            sampled_token_ids[row] = token_ids
            if not self.tokens_from_scheduler:
                self.requests[inputs.request_ids[row]].token_ids.extend(token_ids)
        return ModelRunnerOutput(
            request_ids=inputs.request_ids, sampled_token_ids=sampled_token_ids
        )

    def _fail_rows(self, inputs: StepInputs, output: ModelRunnerOutput, failed: list[int]) -> None:
        """Take back what the non-finite sample rows `failed` emitted and name their
        requests: the scheduler ends them with an error, the rest of the batch goes on."""
        for index in failed:
            row = inputs.sample_rows[index]
            request_id = inputs.request_ids[row]
            output.sampled_token_ids[row] = []
            output.logprobs.pop(request_id, None)
            output.spec_token_ids.pop(request_id, None)
            output.prompt_logprobs.pop(request_id, None)
            output.failed_request_ids.append(request_id)
        logger.warning("Non-finite logits: failing request(s) %s.", output.failed_request_ids)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)
