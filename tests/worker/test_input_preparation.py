"""ModelRunner input preparation: positions, slot mappings and sampled rows of a mixed batch."""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedllm.request import RequestData
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.block_table import (
    compute_slot_mapping,
    group_block_tables,
    make_block_table_array,
)
from pagedllm.worker.model_runner import ModelRunner


def test_block_table_padding_points_at_null_block():
    table = make_block_table_array([[5, 2], [7], []])
    assert table.tolist() == [[5, 2], [7, 0], [0, 0]]


def test_slot_mapping():
    table = make_block_table_array([[5, 2], [7]])
    slots = compute_slot_mapping(table, np.array([0, 0, 1]), np.array([3, 4, 1]), block_size=4)
    assert slots.tolist() == [5 * 4 + 3, 2 * 4 + 0, 7 * 4 + 1]


def test_a_windows_table_points_the_blocks_behind_it_at_the_null_block():
    """Two groups (full attention, an 8-token window) of 4-token blocks, contexts 13 and 5:
    the window's table drops the blocks wholly before position 13 - 8 + 1 = 6 (block 0),
    the full group's keeps all; the step's positions take their slots from kept blocks."""
    block_ids = [([1, 2, 3, 4], [11, 12, 13, 14]), ([5, 6], [15, 16])]
    context_lens = np.array([13, 5])
    full, window = group_block_tables(block_ids, [None, 8], context_lens, block_size=4)
    assert full.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert window.tolist() == [[0, 12, 13, 14], [15, 16, 0, 0]]
    slots = compute_slot_mapping(window, np.array([0, 1]), context_lens, block_size=4)
    assert slots.tolist() == [14 * 4 + 1, 16 * 4 + 1]


def _new(
    request_id: str, prompt: list[int], blocks: list[int], computed: int = 0
) -> NewRequestData:
    return NewRequestData(
        request_id=request_id,
        data=RequestData(prompt, SamplingParams(temperature=0.0)),
        output_token_ids=[],
        block_ids=(blocks,),
        num_computed_tokens=computed,
    )


def test_mixed_prefill_chunk_and_decode():
    runner = ModelRunner(
        model=None, backend=None, kv_caches=[], block_size=4, device=torch.device("cpu")
    )
    step1 = SchedulerOutput(
        scheduled_new_reqs=[_new("a", [10, 11, 12, 13, 14, 15], [3, 1]), _new("b", [20, 21], [2])],
        scheduled_cached_reqs=CachedRequestData(),
        num_scheduled_tokens={"a": 4, "b": 2},  # "a" is chunked: 4 of 6 prompt tokens
        total_num_scheduled_tokens=6,
        finished_request_ids=set(),
    )
    runner._update_states(step1)
    inputs = runner._prepare_inputs(step1)
    assert inputs.input_ids.tolist() == [10, 11, 12, 13, 20, 21]
    assert inputs.positions.tolist() == [0, 1, 2, 3, 0, 1]
    assert inputs.slot_mapping.tolist() == [12, 13, 14, 15, 8, 9]
    assert inputs.sample_rows == [1]  # only "b" finished its prompt
    assert inputs.logits_indices.tolist() == [5]
    runner.requests["b"].token_ids.append(22)  # what _make_output does after sampling
    step2 = SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(["b", "a"], [([],), ([],)], [2, 4]),
        num_scheduled_tokens={"b": 1, "a": 2},
        total_num_scheduled_tokens=3,
        finished_request_ids=set(),
    )
    runner._update_states(step2)
    inputs = runner._prepare_inputs(step2)
    assert inputs.input_ids.tolist() == [22, 14, 15]
    assert inputs.positions.tolist() == [2, 4, 5]
    assert inputs.slot_mapping.tolist() == [10, 4, 5]
    assert inputs.sample_rows == [0, 1]
    assert inputs.logits_indices.tolist() == [0, 2]


def _runner_after_prefills() -> ModelRunner:
    """Requests "a" (6 prompt tokens, blocks 3 and 1) and "b" (2, block 2) prefilled, each
    with one sampled token appended."""
    runner = ModelRunner(
        model=None, backend=None, kv_caches=[], block_size=4, device=torch.device("cpu")
    )
    prefill = SchedulerOutput(
        scheduled_new_reqs=[_new("a", [10, 11, 12, 13, 14, 15], [3, 1]), _new("b", [20, 21], [2])],
        scheduled_cached_reqs=CachedRequestData(),
        num_scheduled_tokens={"a": 6, "b": 2},
        total_num_scheduled_tokens=8,
        finished_request_ids=set(),
    )
    runner._update_states(prefill)
    runner._prepare_inputs(prefill)
    runner.requests["a"].token_ids.append(16)
    runner.requests["b"].token_ids.append(22)
    return runner


def _next_step(runner: ModelRunner, num_scheduled: dict[str, int]):
    """The runner's inputs for a step of the prefilled "b" and "a" (contexts 2 and 6)."""
    step = SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(["b", "a"], [([],), ([],)], [2, 6]),
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        finished_request_ids=set(),
    )
    runner._update_states(step)
    return runner._prepare_inputs(step)


def test_a_decode_step_one_token_a_request():
    """Every request computes one token: the decode branch's arrays."""
    inputs = _next_step(_runner_after_prefills(), {"b": 1, "a": 1})
    assert inputs.input_ids.tolist() == [22, 16]
    assert inputs.positions.tolist() == [2, 6]
    assert inputs.slot_mapping.tolist() == [2 * 4 + 2, 1 * 4 + 2]
    assert inputs.query_start_loc.tolist() == [0, 1, 2]
    assert inputs.query_lens.tolist() == [1, 1]
    assert inputs.context_lens.tolist() == [2, 6]
    assert inputs.sample_rows == [0, 1] and inputs.logits_indices.tolist() == [0, 1]
    assert inputs.positions is not inputs.context_lens  # not aliased


def test_a_request_scheduling_nothing_is_not_a_decode():
    """Two tokens over two requests, but 0 and 2: the general arrays, not one a request."""
    runner = _runner_after_prefills()
    runner.requests["a"].token_ids.append(17)
    inputs = _next_step(runner, {"b": 0, "a": 2})
    assert inputs.input_ids.tolist() == [16, 17]
    assert inputs.positions.tolist() == [6, 7]
    assert inputs.query_start_loc.tolist() == [0, 0, 2]
