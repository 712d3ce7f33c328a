"""The decode stack's reach past its matrices' crossovers (worker/decode_step/stack_reach.py):
which step sizes are timed, the rule that picks the limit, and the measurement's wiring on a
real engine (timings replaced where the test needs a known choice)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import CrossoverMethod
from pagedllm.worker.decode_step import cpu_stack, stack_reach
from pagedllm.worker.decode_step.base import DecodeBatch, StepRequests
from pagedllm.worker.decode_step.stack_reach import (
    MAX_REACH_TOKENS,
    apply_reach,
    choose_reach,
    extend_reach,
    reach_sizes,
    synthetic_prompt,
)

needs_kernels = pytest.mark.skipif(
    cpu_stack._library() is None or not cpu_ops.w4a8_available(), reason="no C compiler"
)


def test_sizes_double_from_twice_the_limit_within_every_bound():
    assert reach_sizes(64, None, 2048, 10**6) == [128, 256, 512]
    assert reach_sizes(64, None, 300, 10**6) == [128, 256, 300]  # the engine's step budget
    assert reach_sizes(64, None, 160, 10**6) == [128, 160]
    assert reach_sizes(64, 200, 2048, 10**6) == [128, 200]  # what the tables can run
    assert reach_sizes(64, None, 2048, 255) == [128, 255]  # the KV slots free to write
    assert reach_sizes(64, None, 100, 10**6) == [100]
    assert reach_sizes(31, 31, 2048, 10**6) == []  # no panels past a W4A8 crossover
    assert reach_sizes(MAX_REACH_TOKENS, None, 4096, 10**6) == []


def test_the_reach_is_the_run_of_sizes_where_the_stack_is_not_slower():
    assert choose_reach(64, {128: (1.0, 1.5), 256: (2.0, 2.0), 512: (4.1, 4.0)}) == 256
    assert choose_reach(64, {128: (1.6, 1.5), 256: (1.0, 2.0)}) == 64  # a run from below
    assert choose_reach(64, {128: (1.0, 1.5), 256: (1.9, 2.0)}) == 256
    assert choose_reach(64, {}) == 64


def test_the_synthetic_prompt_fills_blocks_past_the_null_block():
    inputs = synthetic_prompt(40, 2, 16, vocab_size=32)
    assert inputs.positions.tolist() == list(range(40))
    assert inputs.input_ids.max() < 32
    assert inputs.block_tables[0].tolist() == [[1, 2, 3]] and len(inputs.block_tables) == 2
    assert inputs.slot_mapping.tolist() == list(range(16, 56))


def _runner(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.executor.worker.model_runner


@pytest.fixture
def panels_llm(tiny_llama_dir, bf16_panels) -> LLM:
    """A dense bfloat16 model whose matrices are panels for every step (so the stack and
    the layer loop run the same arithmetic at every size)."""
    bf16_panels("always")
    return LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256)


@needs_kernels
def test_a_synthetic_prompt_gives_the_same_hidden_states_on_the_stack_and_the_layers(
    panels_llm,
):
    runner = _runner(panels_llm)
    stack = runner.decode_step
    inputs = synthetic_prompt(37, len(runner.kv_cache_groups), runner.block_size,
                              stack.dims.vocab_size)
    on_stack = runner.forward_bare(inputs, stack)
    through_layers = runner.forward_bare(inputs, None)
    assert on_stack.shape == (37, stack.dims.hidden)
    assert torch.equal(on_stack, through_layers)
    assert runner.decode_step is stack  # put back


def _measuring(monkeypatch) -> None:
    """Measure as under the default setting whatever PAGEDLLM_BF16_PANELS says (the stack's
    module alone: the panels keep the test's setting), with no earlier choice cached."""
    monkeypatch.setattr(stack_reach, "envs", SimpleNamespace(bf16_panels=lambda: "auto"))
    monkeypatch.setattr(stack_reach, "_REACHED", {})


@needs_kernels
def test_the_measured_reach_decides_which_steps_the_stack_and_the_panels_serve(
    tiny_llama_dir, bf16_panels, monkeypatch
):
    """With timings where the stack wins at 16 and 32 tokens and loses at 64, a stack whose
    panels stop at 8 serves up to 32 (64 is the last size timed), and the layers' panels
    follow it."""
    bf16_panels("8")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256)
    runner = _runner(llm)
    stack = runner.decode_step
    assert stack.max_tokens == 8 and stack.capacity is None
    timed: list[tuple[int, bool]] = []

    def fake_forward(inputs, fast_path):
        timed.append((len(inputs.input_ids), fast_path is not None))
        return object()

    def fake_paired_times(on_stack, through_layers, **_):
        on_stack()
        through_layers()
        stack_wins = timed[-1][0] < 64
        return (0.01, 0.02) if stack_wins else (0.02, 0.01)

    monkeypatch.setattr(runner, "forward_bare", fake_forward)
    monkeypatch.setattr(stack_reach, "paired_best_times", fake_paired_times)
    _measuring(monkeypatch)
    extend_reach(stack, runner, max_step=200)
    assert stack.max_tokens == 32
    assert sorted({tokens for tokens, _ in timed}) == [16, 32, 64]  # stopped at the loss
    assert {on_stack for _, on_stack in timed} == {True, False}
    down_proj = runner.model.model.layers[0].mlp.down_proj.method
    assert isinstance(down_proj, CrossoverMethod) and down_proj.max_tokens == 32
    rows = 32
    batch = DecodeBatch(
        np.zeros(rows, dtype=np.int64), np.arange(rows), np.arange(16, 16 + rows),
        np.ones((1, 2), dtype=np.int64), (),
        StepRequests(np.array([0, rows]), np.array([rows]), np.array([0])),
    )
    assert stack.serves(batch)
    stack.max_tokens = 31
    assert not stack.serves(batch)


@needs_kernels
def test_a_failed_measurement_keeps_the_limit_and_caches_nothing(
    tiny_llama_dir, bf16_panels, monkeypatch
):
    bf16_panels("8")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256)
    runner = _runner(llm)
    stack = runner.decode_step

    def failing(inputs, fast_path):
        raise RuntimeError("no such step")

    monkeypatch.setattr(runner, "forward_bare", failing)
    _measuring(monkeypatch)
    warnings: list[str] = []
    monkeypatch.setattr(stack_reach.logger, "warning",
                        lambda message, *args: warnings.append(message % args))
    extend_reach(stack, runner, max_step=200)
    assert stack.max_tokens == 8
    assert stack_reach._REACHED == {}
    assert warnings and "timing its steps failed (no such step)" in warnings[0]


@needs_kernels
def test_a_step_the_stack_refuses_is_not_timed(tiny_llama_dir, bf16_panels, monkeypatch):
    bf16_panels("8")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256)
    runner = _runner(llm)
    stack = runner.decode_step
    monkeypatch.setattr(stack, "serves", lambda batch: False)  # as for an EAGLE-3 target
    monkeypatch.setattr(stack_reach, "paired_best_times", lambda *a, **k: pytest.fail("timed"))
    _measuring(monkeypatch)
    extend_reach(stack, runner, max_step=200)
    assert stack.max_tokens == 8
    assert stack_reach._REACHED == {}  # another engine of this shape may take such steps


@needs_kernels
def test_a_set_panels_limit_is_the_stacks_limit_too(tiny_llama_dir, bf16_panels, monkeypatch):
    """PAGEDLLM_BF16_PANELS set by the user: nothing is measured, the stack stops there."""
    bf16_panels("3")
    monkeypatch.setattr(stack_reach, "paired_best_times", lambda *a, **k: pytest.fail("timed"))
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256)
    assert _runner(llm).decode_step.max_tokens == 3


@needs_kernels
def test_a_measured_reach_serves_long_prompts_on_the_stack_with_the_layer_loops_tokens(
    tiny_llama_dir, bf16_panels, monkeypatch
):
    """The whole path on a real engine: panels stopping at 4 tokens, the reach measured at
    startup (real timings: any outcome) and then set to 64: the stack serves a 59-token
    first step, and the layers, their panels extended with it, give the same tokens."""
    bf16_panels("4")
    _measuring(monkeypatch)
    monkeypatch.setattr(stack_reach, "MAX_REACH_TOKENS", 64)
    # No prefix cache: the second pass must run the same 59-token step through the layers.
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256,
              enable_prefix_caching=False)
    runner = _runner(llm)
    stack = runner.decode_step
    assert stack.max_tokens in (4, 8, 16, 32, 64)
    apply_reach(stack, 64)
    assert runner.model.model.layers[1].self_attn.qkv_proj.method.max_tokens == 64
    prompts = [{"prompt_token_ids": [(7 * i + 3) % 200 + 1 for i in range(n)]} for n in (50, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)

    def generate() -> list[tuple[list[int], list[float]]]:
        outputs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        return [(list(c.token_ids),
                 [entry[token].logprob for entry, token in zip(c.logprobs, c.token_ids,
                                                               strict=True)])
                for c in outputs]

    served = []
    run = stack.run
    monkeypatch.setattr(stack, "run", lambda batch: served.append(batch.num_rows) or run(batch))
    with_stack = generate()
    assert max(served) == 59  # both prompts in the stack's first step
    runner.decode_step = None
    without = generate()
    runner.decode_step = stack
    assert with_stack == without


def test_the_longest_sequence_bounds_the_sizes():
    """The worker passes the least of the step budget and max_model_len: a synthetic prompt
    never runs past the model's positions."""
    assert reach_sizes(64, None, min(2048, 256), 10**6) == [128, 256]
