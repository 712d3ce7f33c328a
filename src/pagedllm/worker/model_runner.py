"""ModelRunner: turns a SchedulerOutput into one batched forward pass and sampled tokens.

It applies the scheduler's diff to its own per-request state, flattens the scheduled tokens
of all requests (prefill chunks, decodes and verified drafts alike) into one batch, runs the
model (or, for a step the platform has a fast path for, that fast path:
worker/decode_step/), samples with the one sampling pipeline (worker/sampling.py), and
answers with plain lists. It never touches scheduling state. A decode step of plain greedy
requests that no hook acts on skips all of that: the greedy loop (worker/multi_step.py)
takes it whole, the fast path's forward and the LM head's argmax (one C call on the CPU).

Capabilities plug in as step hooks registered by the worker (worker/step_hooks/): LoRA
groups the step's tokens before the forward, pooling and prompt logprobs read the hidden
states after it, speculative decoding proposes the next drafts after sampling. How the
model runs (whole, a pipeline stage, an encoder without KV cache) is chosen once
(worker/model_forward.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata
from pagedllm.attention.torch_paged import TorchPagedBackend
from pagedllm.core.kv_cache_groups import KVCacheGroupSpec
from pagedllm.core.sched_output import CachedRequestData, SchedulerOutput
from pagedllm.distributed.parallel_state import get_pp_group, get_tp_group
from pagedllm.layers.forward_context import ForwardContext
from pagedllm.logger import init_logger
from pagedllm.spec_decode.verify import AttentionRows, split_verify_rows
from pagedllm.worker.block_table import compute_slot_mapping, group_block_tables
from pagedllm.worker.decode_step.base import DecodeBatch, DecodeStep, StepRequests
from pagedllm.worker.input_batch import CachedRequestState, StepInputs
from pagedllm.worker.model_forward import ForwardInputs, make_model_forward
from pagedllm.worker.multi_step import GreedyDecodeLoop, StopTokens, run_extra_steps
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.sampling import SamplingPipeline, only_argmax
from pagedllm.worker.step_hooks import RunnerStep, StepHook

if TYPE_CHECKING:
    from pagedllm.models.interfaces import CausalLM

logger = init_logger(__name__)


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
        activation_dtype: the dtype activations travel between pipeline stages in.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        block_size: int,
        device: torch.device,
        kv_cache_groups: tuple[KVCacheGroupSpec, ...] | None = None,
        activation_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model
        tp_group, pp_group = get_tp_group(), get_pp_group()
        self.is_driver = tp_group.is_first_rank and pp_group.is_last_rank
        # Several ranks: only one samples, so the scheduler sends everyone the tokens.
        self.tokens_from_scheduler = tp_group.world_size * pp_group.world_size > 1
        self.backend = backend
        # Steps the backend does not serve (image tokens attending both ways) run here.
        self.reference_backend = TorchPagedBackend()
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.kv_cache_groups = kv_cache_groups or (
            KVCacheGroupSpec(tuple(range(len(kv_caches)))),
        )
        self.group_of_layer = [0] * len(kv_caches)
        for group_id, group in enumerate(self.kv_cache_groups):
            for layer_index in group.layer_indices:
                self.group_of_layer[layer_index] = group_id
        self.model_forward = make_model_forward(model, pp_group, activation_dtype, device)
        self.sampling = SamplingPipeline(cast("CausalLM", model), device, self.is_driver)
        # Registered by the worker at load (worker/step_hooks/), called in this order.
        self.hooks: list[StepHook] = []
        # The platform's decode-step fast path, set by the worker where one serves.
        self.decode_step: DecodeStep | None = None
        # Positions may be written again (speculative decoding rolls rejected drafts back):
        # backends must not reuse what they read of a context in earlier steps.
        self.contexts_rewritten = False
        self.requests: dict[str, CachedRequestState] = {}

    def hook(self, kind: type[StepHook]) -> StepHook | None:
        """The registered hook of `kind`, if any."""
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduler step (its `num_steps` decode steps: worker/multi_step.py)
        and return the sampled tokens per request."""
        self._update_states(scheduler_output)
        output = self._greedy_steps(scheduler_output)
        if output is not None:
            return output
        output = self._run_step(scheduler_output)
        if scheduler_output.num_steps > 1:
            states = [self.requests[rid] for rid in output.request_ids]
            output = run_extra_steps(self._execute_step, scheduler_output, output,
                                     self._greedy_loop(states), StopTokens.of(states))
        return output

    def _greedy_steps(self, scheduled: SchedulerOutput) -> ModelRunnerOutput | None:
        """A decode step of plain greedy requests (its `num_steps` steps) taken whole by
        the greedy loop (worker/multi_step.py): the fast path's forward and the LM head's
        argmax, one C call on the CPU stack, without the input arrays, the sampling
        pipeline or the hooks, none of which acts on such a step. None (nothing run) for
        any other step, or where the loop did not take the first step (a failed row: the
        runner's own step then fails it as always)."""
        if (
            scheduled.scheduled_new_reqs or scheduled.scheduled_spec_decode_tokens
            or scheduled.structured_output_request_ids or scheduled.is_empty
            or not self.sampling.samples or self.tokens_from_scheduler
            or any(count != 1 for count in scheduled.num_scheduled_tokens.values())
        ):
            return None
        request_ids = list(scheduled.num_scheduled_tokens)
        states = [self.requests[request_id] for request_id in request_ids]
        # Each row computes its latest sampled token (past the prompt: no prompt logprobs
        # to score, no prompt chunk of one token).
        if any(s.num_computed_tokens != s.num_tokens - 1
               or s.num_computed_tokens < s.num_prompt_tokens for s in states):
            return None
        loop = self._greedy_loop(states)
        if loop is None:
            return None
        output = ModelRunnerOutput(request_ids=request_ids,
                                   sampled_token_ids=[[] for _ in request_ids])
        # (a step alone ends after its one step: no stop tokens to look for)
        stops = StopTokens.of(states) if scheduled.num_steps > 1 else StopTokens(None)
        taken = loop.run(scheduled.num_steps, output, stops)
        if taken == 0:
            return None  # (the loop appended nothing to the states)
        return run_extra_steps(self._execute_step, scheduled, output, None, stops, done=taken)

    def _greedy_loop(self, states: list[CachedRequestState]) -> GreedyDecodeLoop | None:
        """The greedy loop (worker/multi_step.py) for a decode step of `states` when every
        request samples its plain argmax, the decode-step fast path serves the step, and
        no hook acts on a decode step; else None."""
        custom = self.sampling.custom
        if (
            self.decode_step is None or not self.kv_cache_groups
            or any(hook.per_step for hook in self.hooks)
            or (custom is not None and not custom.argmax_invariant)
        ):
            return None
        if not all(only_argmax(state) for state in states):
            return None
        return GreedyDecodeLoop(states, self.decode_step, cast("CausalLM", self.model),
                                self.block_size, self.kv_cache_groups)

    def _execute_step(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and return the sampled tokens per request."""
        self._update_states(scheduler_output)
        return self._run_step(scheduler_output)

    def _run_step(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step whose requests' states are up to date: the sampled tokens per
        request."""
        if scheduler_output.is_empty:
            empty = ModelRunnerOutput(request_ids=[], sampled_token_ids=[])
            for hook in self.hooks:
                hook.on_empty_step(scheduler_output, empty)
            return empty
        inputs = self._prepare_inputs(scheduler_output)
        states = [self.requests[rid] for rid in inputs.request_ids]
        step = RunnerStep(scheduler_output, inputs, states, self._to_device)
        for hook in self.hooks:
            hook.before_forward(step)
        hidden_states = self._forward(step)
        if hidden_states is None:  # a pipeline stage before the last: passed on
            return ModelRunnerOutput(request_ids=[], sampled_token_ids=[])
        output = ModelRunnerOutput(request_ids=inputs.request_ids, sampled_token_ids=[])
        for hook in self.hooks:  # before the sampled tokens join the states
            hook.after_forward(step, hidden_states, output)
        sampled = self.sampling.sample(step, hidden_states)
        output.sampled_token_ids = self._append_sampled(inputs, sampled.emitted)
        output.logprobs = sampled.logprobs
        for hook in self.hooks:
            hook.after_sampling(step, hidden_states, output)
        if sampled.failed:
            self._fail_rows(inputs, output, sampled.failed)
        return output

    # ------------------------------------------------------------------ request states

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        self._drop_requests(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            state = CachedRequestState.from_new(new)
            self.requests[new.request_id] = state
            for hook in self.hooks:
                hook.add_request(state, new)
        cached = scheduler_output.scheduled_cached_reqs
        num_blocks_kept = cached.num_blocks_kept or [None] * cached.num_requests
        for request_id, new_block_ids, num_computed, num_kept in zip(
            cached.request_ids, cached.new_block_ids, cached.num_computed_tokens,
            num_blocks_kept, strict=True,
        ):
            state = self.requests[request_id]
            for table, new_ids in zip(state.block_ids, new_block_ids, strict=True):
                if num_kept is not None:
                    del table[num_kept:]  # blocks of rejected drafts, freed
                table.extend(new_ids)
            state.num_computed_tokens = num_computed
        if cached.new_token_ids:  # several ranks: tokens sampled in earlier steps
            for request_id, num_computed, token_ids in zip(
                cached.request_ids, cached.num_computed_tokens, cached.new_token_ids,
                strict=True,
            ):
                if token_ids:
                    state = self.requests[request_id]
                    del state.token_ids[max(num_computed, state.num_prompt_tokens):]
                    state.token_ids.extend(token_ids)

    def _drop_requests(self, scheduler_output: SchedulerOutput) -> None:
        """Forget finished and preempted requests (the hooks first)."""
        finished = scheduler_output.finished_request_ids
        if not finished:
            return
        dropped = {request_id: self.requests.pop(request_id, None) for request_id in finished}
        swapped_out = {device for device, _ in scheduler_output.blocks_to_swap_out}
        for hook in self.hooks:
            hook.drop_requests(dropped, swapped_out)

    # --------------------------------------------------------------------- the batch

    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> StepInputs:
        request_ids = list(scheduler_output.num_scheduled_tokens)
        states = [self.requests[rid] for rid in request_ids]
        context_lens = np.array([s.num_computed_tokens for s in states], dtype=np.int64)
        scheduled = scheduler_output.num_scheduled_tokens
        drafts_of = scheduler_output.scheduled_spec_decode_tokens
        if all(count == 1 for count in scheduled.values()):
            # One token a request (a decode step): positions are the context lengths. (The
            # general arrays below cost ~20 us a step in numpy calls on cold caches.)
            num_tokens = len(states)
            query_lens = np.ones(num_tokens, dtype=np.int64)
            query_start_loc = np.arange(num_tokens + 1, dtype=np.int64)
            req_indices, positions = query_start_loc[:-1], context_lens.copy()
            input_ids = np.array(
                [s.token_ids[c] for s, c in zip(states, positions.tolist(), strict=True)],
                dtype=np.int64,
            )
        else:
            query_lens = np.array([scheduled[rid] for rid in request_ids], dtype=np.int64)
            query_start_loc = np.zeros(len(states) + 1, dtype=np.int64)
            np.cumsum(query_lens, out=query_start_loc[1:])
            num_tokens = int(query_start_loc[-1])
            # Position of every token: its request's context length plus its offset.
            req_indices = np.repeat(np.arange(len(states)), query_lens)
            offsets = np.arange(num_tokens) - np.repeat(query_start_loc[:-1], query_lens)
            positions = context_lens[req_indices] + offsets
            input_ids = _input_ids(states, context_lens, query_lens, drafts_of, num_tokens)
        groups = self.kv_cache_groups if self.model_forward.uses_kv_cache else ()
        block_tables = group_block_tables([s.block_ids for s in states],
                                          [g.sliding_window for g in groups], context_lens,
                                          self.block_size)
        slot_mappings = [compute_slot_mapping(table, req_indices, positions, self.block_size)
                         for table in block_tables]
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

    # ------------------------------------------------------------------- the forward

    def _forward(self, step: RunnerStep) -> torch.Tensor | None:
        """The last hidden states: from the decode-step fast path where it serves, else
        from the model; None on a pipeline stage before the last."""
        inputs = step.inputs
        rows = None
        if self.model_forward.uses_kv_cache:
            rows = _attention_rows(inputs)
            # Image items that attend both ways (key_ends) need the reference backend.
            plain = (
                step.mm_embeds is None and step.rope_positions is None and step.key_ends is None
            )
            batch = self._decode_batch(inputs, rows) if plain else None
            if batch is not None:
                return cast(DecodeStep, self.decode_step).run(batch)
        return self.model_forward(ForwardInputs(
            input_ids=self._to_device(inputs.input_ids),
            positions=self._to_device(
                inputs.positions if step.rope_positions is None else step.rope_positions
            ),
            context=None if rows is None else self._forward_context(inputs, rows, step.key_ends),
            query_lens=inputs.query_lens.tolist(),
            token_type_ids=self._token_type_ids(step.states),
            mm_embeds=step.mm_embeds,
        ))

    @torch.inference_mode()
    def forward_bare(
        self, inputs: StepInputs, fast_path: DecodeStep | None
    ) -> torch.Tensor | None:
        """The last hidden states of a step of no known request (no hooks, no sampling;
        its KV written to `inputs`' slots): through `fast_path` (None when it does not
        serve the step), or through the model's layers when `fast_path` is None. For the
        worker's measurements at startup (decode_step/stack_reach.py)."""
        kept, self.decode_step = self.decode_step, fast_path
        try:
            if fast_path is not None:
                batch = self._decode_batch(inputs, _attention_rows(inputs))
                return None if batch is None else fast_path.run(batch)
            return self._forward(RunnerStep(
                SchedulerOutput(
                    scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData(),
                    num_scheduled_tokens=dict(zip(
                        inputs.request_ids, inputs.query_lens.tolist(), strict=True)),
                    total_num_scheduled_tokens=len(inputs.input_ids),
                    finished_request_ids=set(),
                ),
                inputs, [], self._to_device,
            ))
        finally:
            self.decode_step = kept

    def _decode_batch(self, inputs: StepInputs, rows: AttentionRows) -> DecodeBatch | None:
        """The step for the decode-step fast path, when it is decode-only (one token a
        row) or mixed where the path takes mixed steps, and the path serves it; else
        None."""
        fast_path = self.decode_step
        if fast_path is None:
            return None
        requests = None
        if not bool((rows.query_lens == 1).all()):
            if not fast_path.takes_mixed_steps:
                return None
            requests = StepRequests(rows.query_start_loc, rows.query_lens, rows.context_lens)
        batch = DecodeBatch(
            inputs.input_ids, inputs.positions, inputs.slot_mapping, rows.block_tables[0],
            tuple(zip(inputs.slot_mappings[1:], rows.block_tables[1:], strict=True)),
            requests,
        )
        return batch if fast_path.serves(batch) else None

    def _forward_context(
        self, inputs: StepInputs, rows: AttentionRows, key_ends: np.ndarray | None = None
    ) -> ForwardContext:
        """The backend's metadata for every KV cache group, and the layers' caches. A step
        whose image tokens attend both ways (`key_ends`) runs on the reference backend,
        the one that reads them (the caches' layout is every backend's)."""
        common = self._common_metadata(inputs, rows)
        backend = self.backend
        if key_ends is not None:
            common.key_ends = self._to_device(key_ends)
            backend = self.reference_backend
        group_metadata = [backend.build_metadata(common, self.block_size)]
        for table, slots in zip(rows.block_tables[1:], inputs.slot_mappings[1:], strict=True):
            group_common = dataclasses.replace(
                common, block_tables=self._to_device(table), slot_mapping=self._to_device(slots)
            )
            group_metadata.append(backend.build_metadata(group_common, self.block_size))
        layer_metadata = None
        if len(group_metadata) > 1:
            layer_metadata = [group_metadata[g] for g in self.group_of_layer]
        return ForwardContext(backend, group_metadata[0], self.kv_caches, layer_metadata)

    def _common_metadata(
        self, inputs: StepInputs, rows: AttentionRows
    ) -> CommonAttentionMetadata:
        query_lens, context_lens = rows.query_lens, rows.context_lens
        seq_lens = context_lens + query_lens
        return CommonAttentionMetadata(
            num_reqs=len(query_lens),
            num_tokens=len(inputs.input_ids),
            query_start_loc=self._to_device(rows.query_start_loc),
            query_lens=self._to_device(query_lens),
            context_lens=self._to_device(context_lens),
            seq_lens=self._to_device(seq_lens),
            max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_tables=self._to_device(rows.block_tables[0]),
            slot_mapping=self._to_device(inputs.slot_mapping),
            query_lens_cpu=query_lens.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
            contexts_rewritten=self.contexts_rewritten,
        )

    def _token_type_ids(self, states: Sequence[CachedRequestState]) -> torch.Tensor | None:
        """[T] every token's type when some request of the step has them, else None."""
        if all(s.token_type_ids is None for s in states):
            return None
        return self._to_device(np.concatenate([
            np.asarray(s.token_type_ids or [0] * s.num_tokens, dtype=np.int64) for s in states
        ]))  # fmt: skip

    # -------------------------------------------------------------------- the output

    def _append_sampled(self, inputs: StepInputs, emitted: list[list[int]]) -> list[list[int]]:
        """Per batch row, the tokens it sampled (appended to its state, unless the
        scheduler sends every rank the tokens)."""
        sampled_token_ids: list[list[int]] = [[] for _ in inputs.request_ids]
        for row, token_ids in zip(inputs.sample_rows, emitted, strict=True):
            sampled_token_ids[row] = token_ids
            if not self.tokens_from_scheduler:
                self.requests[inputs.request_ids[row]].token_ids.extend(token_ids)
        return sampled_token_ids

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


def _input_ids(
    states: Sequence[CachedRequestState], context_lens: np.ndarray, query_lens: np.ndarray,
    drafts_of: dict[str, list[int]], num_tokens: int,
) -> np.ndarray:
    """[T] the step's tokens: each request's next query tokens (its drafts last)."""
    return np.fromiter(
        (
            t
            for s, c, q in zip(states, context_lens, query_lens, strict=True)
            for t in (
                s.token_ids[c : c + q]
                if s.request_id not in drafts_of
                else s.token_ids[c:] + drafts_of[s.request_id]
            )
        ),
        dtype=np.int64,
        count=num_tokens,
    )


def _attention_rows(inputs: StepInputs) -> AttentionRows:
    """The batch as attention sees it: verifications as decode rows (spec_decode/verify.py),
    every other request as one row."""
    if inputs.has_drafts:
        return split_verify_rows(
            inputs.query_lens, inputs.context_lens, inputs.block_tables, inputs.num_drafts
        )
    return AttentionRows(
        inputs.query_start_loc, inputs.query_lens, inputs.context_lens, inputs.block_tables
    )
