"""The decode stack's reach past its matrices' crossovers (worker/decode_step/stack_reach.py):
which step sizes are timed, the rule that picks the limit, and the measurement's wiring on a
real engine (timings replaced where the test needs a known choice)."""

from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.layers import cpu_ops
from pagedllm.worker.decode_step import cpu_stack, stack_reach
from pagedllm.worker.decode_step.base import DecodeBatch, StepRequests
from pagedllm.worker.decode_step.stack_reach import (
    MAX_REACH_TOKENS,
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


@needs_kernels
def test_the_measured_reach_decides_which_steps_the_stack_serves(panels_llm, monkeypatch):
    """With timings where the stack wins at 16 and 32 tokens and loses at 64, a stack
    limited to 8 serves up to 32: 64 is the last size timed, a larger one never."""
    runner = _runner(panels_llm)
    stack = runner.decode_step
    stack.max_tokens = 8
    timed: list[tuple[int, bool]] = []

    def fake_forward(inputs, fast_path):
        timed.append((len(inputs.input_ids), fast_path is not None))

    def fake_paired_times(on_stack, through_layers, **_):
        on_stack()
        through_layers()
        stack_wins = timed[-1][0] < 64
        return (1.0, 2.0) if stack_wins else (2.0, 1.0)

    monkeypatch.setattr(runner, "forward_bare", fake_forward)
    monkeypatch.setattr(stack_reach, "paired_best_times", fake_paired_times)
    monkeypatch.setattr(stack_reach.envs, "bf16_panels", lambda: "auto")
    monkeypatch.setattr(stack_reach, "_REACHED", {})
    extend_reach(stack, runner, max_step=200)
    assert stack.max_tokens == 32
    assert sorted({tokens for tokens, _ in timed}) == [16, 32, 64]  # stopped at the loss
    assert {on_stack for _, on_stack in timed} == {True, False}
    rows = 32
    batch = DecodeBatch(
        torch.zeros(rows, dtype=torch.int64).numpy(), torch.arange(rows).numpy(),
        torch.arange(16, 16 + rows).numpy(), torch.ones(1, 2, dtype=torch.int64).numpy(), (),
        StepRequests(*(torch.tensor(v).numpy() for v in ([0, rows], [rows], [0]))),
    )
    assert stack.serves(batch)
    stack.max_tokens = 31
    assert not stack.serves(batch)


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
    """The whole path on a real engine: panels limited to 4 tokens by the load-time rule
    (stood in for here), timings where the stack always wins: the stack serves prompts of
    up to 64 tokens, and with panels for every step the tokens equal the layer loop's."""
    bf16_panels("always")
    monkeypatch.setattr(cpu_stack, "max_stack_tokens",
                        lambda layers, per_matrix=None: 4 if per_matrix is None else None)
    monkeypatch.setattr(stack_reach.envs, "bf16_panels", lambda: "auto")
    monkeypatch.setattr(stack_reach, "_REACHED", {})
    monkeypatch.setattr(stack_reach, "MAX_REACH_TOKENS", 64)
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256)
    runner = _runner(llm)
    assert runner.decode_step.max_tokens in (4, 8, 16, 32, 64)  # real timings, any outcome
    runner.decode_step.max_tokens = 64
    prompts = [{"prompt_token_ids": [(7 * i + 3) % 200 + 1 for i in range(n)]} for n in (50, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    served = []
    run = runner.decode_step.run
    monkeypatch.setattr(runner.decode_step, "run",
                        lambda batch: served.append(batch.num_rows) or run(batch))
    with_stack = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert max(served) == 59  # both prompts in the stack's first step
    stack, runner.decode_step = runner.decode_step, None
    without = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    runner.decode_step = stack
    assert with_stack == without
