"""ModelRunner: turns a SchedulerOutput into one batched forward pass and sampled tokens.

It applies the scheduler's diff to its own per-request state, flattens the scheduled tokens
of all requests (prefill chunks and decodes alike) into one batch, builds the attention
metadata once, runs the model inside the forward context, computes logits only at positions
that sample, and samples. It never touches scheduling state: its answer is plain lists.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.layers.forward_context import ForwardContext, set_forward_context
from pagedllm.layers.sampler import Sampler, SamplingMetadata
from pagedllm.worker.block_table import compute_slot_mapping, make_block_table_array
from pagedllm.worker.input_batch import CachedRequestState, StepInputs
from pagedllm.worker.outputs import ModelRunnerOutput


class ModelRunner:
    """Runs the model for the requests the scheduler chose.

    Args:
        model: a CausalLM (see models/interfaces.py) on `device`.
        backend: the attention backend.
        kv_caches: one KV tensor per layer, in the backend's layout.
        block_size: tokens per KV block.
        device: torch device of the model.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        block_size: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.requests: dict[str, CachedRequestState] = {}

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and return the sampled tokens per request."""
        self._update_states(scheduler_output)
        if scheduler_output.is_empty:
            return ModelRunnerOutput(request_ids=[], sampled_token_ids=[])
        inputs = self._prepare_inputs(scheduler_output)
        hidden_states = self._forward(inputs)
        sampled = self._sample(inputs, hidden_states)
        return self._make_output(inputs, sampled)

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        for request_id in scheduler_output.finished_request_ids:
            self.requests.pop(request_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.request_id] = CachedRequestState(
                request_id=new.request_id,
                token_ids=list(new.prompt_token_ids) + list(new.output_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                sampling_params=new.sampling_params,
                eos_token_id=new.eos_token_id,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
            )
        cached = scheduler_output.scheduled_cached_reqs
        for request_id, new_block_ids, num_computed in zip(
            cached.request_ids, cached.new_block_ids, cached.num_computed_tokens
        ):
            state = self.requests[request_id]
            state.block_ids.extend(new_block_ids)
            state.num_computed_tokens = num_computed

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
        input_ids = np.fromiter(
            (t for s, c, q in zip(states, context_lens, query_lens) for t in s.token_ids[c : c + q]),
            dtype=np.int64,
            count=num_tokens,
        )
        block_table = make_block_table_array([s.block_ids for s in states])
        slot_mapping = compute_slot_mapping(block_table, req_indices, positions, self.block_size)
        ends = context_lens + query_lens
        sample_rows = [i for i, s in enumerate(states) if ends[i] >= s.num_tokens]
        return StepInputs(
            request_ids=request_ids,
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            query_lens=query_lens,
            context_lens=context_lens,
            block_table=block_table,
            sample_rows=sample_rows,
        )

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        common = self._build_common_metadata(inputs)
        attn_metadata = self.backend.build_metadata(common, self.block_size)
        context = ForwardContext(self.backend, attn_metadata, self.kv_caches)
        with set_forward_context(context):
            return self.model(
                self._to_device(inputs.input_ids), self._to_device(inputs.positions)
            )  # [num_tokens, hidden_size]

    def _build_common_metadata(self, inputs: StepInputs) -> CommonAttentionMetadata:
        seq_lens = inputs.context_lens + inputs.query_lens
        return CommonAttentionMetadata(
            num_reqs=len(inputs.request_ids),
            num_tokens=len(inputs.input_ids),
            query_start_loc=self._to_device(inputs.query_start_loc),
            query_lens=self._to_device(inputs.query_lens),
            context_lens=self._to_device(inputs.context_lens),
            seq_lens=self._to_device(seq_lens),
            max_query_len=int(inputs.query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_tables=self._to_device(inputs.block_table),
            slot_mapping=self._to_device(inputs.slot_mapping),
            query_lens_cpu=inputs.query_lens.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
        )

    def _sample(self, inputs: StepInputs, hidden_states: torch.Tensor) -> list[int]:
        if not inputs.sample_rows:
            return []
        logits_indices = self._to_device(inputs.logits_indices)
        logits = self.model.compute_logits(hidden_states[logits_indices]).float()  # [n, vocab]
        states = [self.requests[inputs.request_ids[row]] for row in inputs.sample_rows]
        metadata = SamplingMetadata.build(
            [s.sampling_params for s in states],
            [s.num_output_tokens for s in states],
            [s.eos_token_id for s in states],
            self.device,
        )
        return self.sampler(logits, metadata).tolist()

    def _make_output(self, inputs: StepInputs, sampled: list[int]) -> ModelRunnerOutput:
        sampled_token_ids: list[list[int]] = [[] for _ in inputs.request_ids]
        for row, token_id in zip(inputs.sample_rows, sampled):
            sampled_token_ids[row] = [token_id]
            self.requests[inputs.request_ids[row]].token_ids.append(token_id)
        return ModelRunnerOutput(request_ids=inputs.request_ids, sampled_token_ids=sampled_token_ids)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)
