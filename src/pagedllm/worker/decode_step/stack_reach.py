"""How far the one-call decode stack serves past its matrices' own crossovers.

On CPUs with matrix units (AMX) a dense bfloat16 matrix's panels (bf16_panels.py) serve
steps up to the size where oneDNN's packed matmul overtakes them (64-128 tokens), and the
stack stopped there: a larger step (a serving step of 32 decodes beside a 128-token prompt)
ran the Python layers on torch's dense weights. That limit compares one matrix alone. A step
through the layers also pays for its ~400 dispatched ops, their intermediate tensors and
the threads waiting between them, which the stack's one call does not: 32 decodes beside a
128-token prompt took 91 ms through the layers and 53-56 ms on the stack (BENCHMARKS.md).

So where the stack's tables can run steps larger than its limit (`CpuDecodeStack.capacity`:
the panels multiply any size), the worker times whole steps once at startup, as it captures
CUDA graphs there: a synthetic prompt of each size through the stack and through the layers,
and the stack takes the sizes up to the last one timed before the first where it is slower
(once per process, model shape and step bounds). The layers' panels then serve those sizes too
(cpu_tables.extend_panels), so a step the layers run instead multiplies as the stack would.
The synthetic prompt writes its KV into blocks no request holds yet (every block is free
when the worker first builds the stack; rebuilds reuse the choice). Only the default
(PAGEDLLM_BF16_PANELS unset) measures; a set value is the stack's limit too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pagedllm import envs
from pagedllm.layers.cpu_tables import extend_panels
from pagedllm.layers.quantization.crossover import paired_best_times
from pagedllm.logger import init_logger
from pagedllm.worker.decode_step.cpu_stack_layers import matrices
from pagedllm.worker.input_batch import StepInputs

if TYPE_CHECKING:
    from pagedllm.worker.decode_step.cpu_stack import CpuDecodeStack
    from pagedllm.worker.model_runner import ModelRunner

logger = init_logger(__name__)

# The largest step timed: a pass of 512 tokens takes ~0.3 s on the default model, so the
# measurement adds ~2 s to a start; larger steps (long prompts alone) keep the layers.
MAX_REACH_TOKENS = 512
# Passes timed per path and size, in turn, after one of each to warm up; the best is kept.
_ROUNDS = 2
# A pass through the layers longer than this ends the measurement at its size (a larger
# model's start would grow by seconds a size).
_SLOW_PASS_S = 0.5
# The reach chosen per model shape, limit and sizes timed (which the step budget,
# max_model_len and the cache's blocks bound): measured once per process (as the panels'
# limit is), so two engines of one model and configuration take the same path for a step.
_REACHED: dict[tuple[object, ...], int] = {}


def reach_sizes(limit: int, capacity: int | None, max_step: int, max_slots: int) -> list[int]:
    """The step sizes to time: doubling from twice the stack's `limit`, then the bound
    itself: the least of its `capacity` (None: any), the engine's largest step `max_step`
    (a small step budget's steps are all of that size or less), the slots the synthetic
    prompt may write (`max_slots`) and MAX_REACH_TOKENS."""
    bound = min(max_step, max_slots, MAX_REACH_TOKENS)
    if capacity is not None:
        bound = min(bound, capacity)
    sizes, size = [], 2 * limit
    while size < bound:
        sizes.append(size)
        size *= 2
    if bound > limit:
        sizes.append(bound)
    return sizes


def choose_reach(limit: int, timings: dict[int, tuple[float, float]]) -> int:
    """The stack's new limit from `timings[tokens]` = (seconds on the stack, seconds through
    the layers): the largest size of the run of sizes from the smallest where the stack is
    not slower, else `limit`."""
    reach = limit
    for tokens in sorted(timings):
        stack_s, layers_s = timings[tokens]
        if stack_s > layers_s:
            break
        reach = tokens
    return reach


def synthetic_prompt(num_tokens: int, num_groups: int, block_size: int,
                     vocab_size: int) -> StepInputs:
    """A prompt of `num_tokens` tokens computed whole, its KV in blocks 1, 2, ... of every
    KV cache group (block 0 is the null block)."""
    num_blocks = -(-num_tokens // block_size)
    table = np.arange(1, num_blocks + 1, dtype=np.int64)[None, :]
    slots = np.arange(block_size, block_size + num_tokens, dtype=np.int64)
    return StepInputs(
        request_ids=["stack-reach"],
        input_ids=np.arange(num_tokens, dtype=np.int64) % vocab_size,
        positions=np.arange(num_tokens, dtype=np.int64),
        slot_mappings=[slots] * num_groups,
        query_start_loc=np.array([0, num_tokens], dtype=np.int64),
        query_lens=np.array([num_tokens], dtype=np.int64),
        context_lens=np.zeros(1, dtype=np.int64),
        block_tables=[table] * num_groups,
        sample_rows=[0],
        pooling_rows=[],
    )


def extend_reach(stack: CpuDecodeStack, runner: ModelRunner, max_step: int,
                 measure: bool = True) -> None:
    """Raise `stack.max_tokens` to the largest step size where whole steps are measured
    faster on the stack than through the layers (module docstring), where its tables can
    run steps past it; the layers' panels then serve those sizes too (`apply_reach`).
    `max_step`: the engine's largest step and longest sequence, whichever is less. A
    choice made for this shape earlier in the process is reused; else only with `measure`
    (the worker's first build: a rebuild's caches may hold live blocks) it is measured. A
    measurement that fails leaves the limit, with a warning."""
    limit = stack.max_tokens
    if limit is None or envs.bf16_panels() != "auto":
        return
    block_size = runner.block_size
    sizes = reach_sizes(limit, stack.capacity, max_step, (stack.dims.num_blocks - 1) * block_size)
    if not sizes:
        return
    dims = stack.dims
    key = (type(stack.decoder).__name__, dims.num_layers, dims.hidden, dims.intermediate,
           dims.num_heads, dims.num_kv_heads, dims.head_size, dims.vocab_size, dims.kv_bf16,
           stack.num_groups, limit, tuple(sizes))
    reach = _REACHED.get(key)
    if reach is None and measure:
        try:
            reach = _measure_reach(stack, runner, limit, sizes)
        except Exception as error:  # noqa: BLE001 - any failure keeps the matrices' limit
            logger.warning("Decode stack: timing its steps failed (%s); it keeps steps of up "
                           "to %d tokens.", error, limit)
            return
        if reach is not None:
            _REACHED[key] = reach
    if reach is not None:
        apply_reach(stack, reach)


def apply_reach(stack: CpuDecodeStack, reach: int) -> None:
    """The stack serves steps of up to `reach` tokens, and so do its layers' panels where
    they stopped short (cpu_tables.extend_panels): a step the layers run instead (one the
    stack does not take) multiplies as the stack would, so the two stay bit-identical."""
    if stack.max_tokens is not None and reach <= stack.max_tokens:
        return
    for layer in stack.layers:
        for linear in matrices(layer):
            extend_panels(linear.method.base_method(), reach)
    stack.max_tokens = reach


def _measure_reach(stack: CpuDecodeStack, runner: ModelRunner, limit: int,
                   sizes: list[int]) -> int | None:
    """Time each size on the stack and through the layers, from the smallest, until the
    stack is slower, the stack refuses the step or a pass takes over _SLOW_PASS_S; the
    reach `choose_reach` makes of it, or None when no size was timed (a stack refusing
    such steps says nothing about another engine's of the same shape)."""
    timings: dict[int, tuple[float, float]] = {}
    stack.max_tokens = sizes[-1]  # the stack serves every size timed while it is timed
    try:
        for tokens in sizes:
            inputs = synthetic_prompt(tokens, stack.num_groups, runner.block_size,
                                      stack.dims.vocab_size or 1)
            if runner.forward_bare(inputs, stack) is None:
                break  # a step the stack does not take (a model keeping hidden states)
            timings[tokens] = paired_best_times(
                lambda: runner.forward_bare(inputs, stack),  # noqa: B023 (timed right here)
                lambda: runner.forward_bare(inputs, None),  # noqa: B023
                min_rounds=_ROUNDS, min_seconds=0.0,
            )
            on_stack, layers = timings[tokens]
            if on_stack > layers or layers > _SLOW_PASS_S:
                break  # the larger sizes would not be taken, or cost too long a start
    finally:
        stack.max_tokens = limit
    if not timings:
        return None
    reach = choose_reach(limit, timings)
    ratios = ", ".join(f"{t}: {layers / on_stack:.2f}x"
                       for t, (on_stack, layers) in sorted(timings.items()))
    logger.info("Decode stack: steps of up to %d tokens (its limit by the matrices alone: %d; "
                "its speedup over the layers by tokens %s).", reach, limit, ratios)
    return reach
