"""Plain greedy decode steps in one C call (csrc/decode_loop.c through
CpuDecodeStack.greedy_steps): a step alone and a multi-step's steps together give the
tokens of the runner's own step (the stack, then the sampling pipeline's head), on every
vector variant, with either KV cache, and the loop really taking the steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from pagedllm import LLM, SamplingParams, kernels
from pagedllm.kernels.variants import runnable_variants
from pagedllm.layers import cpu_ops
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect
from pagedllm.worker.decode_step import cpu_stack
from pagedllm.worker.decode_step.cpu_stack import CpuDecodeStack
from pagedllm.worker.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(
    cpu_stack._library() is None or not cpu_ops.w4a8_available(),
    reason="no C compiler",
)

PROMPTS = [[5, 17, 42, 8, 99, 3], [7, 7, 12], [101, 55, 23, 61, 9, 14, 30, 2, 77], [4, 44]]
# More requests than the matmul kernel's tile of 8 tokens.
MANY_PROMPTS = [[i + 3, 2 * i + 5, 11] for i in range(10)]
# Vector variants with their own byte dot products (amx_bf16 adds dense bf16 matmuls and the
# prefill attention on AMX's tiles to avx512_bf16's: the same byte dot products, and both
# arms of a test prefill alike).
VARIANTS = [v.name for v in runnable_variants(detect()) if v.simd and v.extends is None]


@pytest.fixture(autouse=True)
def fixed_kernels(dense_from_tokens) -> None:
    """No W4A8 / dense crossover timed at load (the once-per-process answer cleared): the
    stack serves steps of any rows, and every step of both engines of a test, whatever its
    size, runs the same kernels (the bf16 panels' steps are fixed for every test:
    conftest.py). Timed, a loaded machine can draw a crossover below a test's rows."""
    dense_from_tokens("never")


def _tokens(llm: LLM, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture
def loop_steps(monkeypatch) -> list[int]:
    """The steps every C loop call took (it still takes them)."""
    taken: list[int] = []
    original = CpuDecodeStack.greedy_steps

    def counting(self, batch, steps, head, stop_ids=None):
        result = original(self, batch, steps, head, stop_ids)
        if result is not None:
            taken.append(len(result))
        return result

    monkeypatch.setattr(CpuDecodeStack, "greedy_steps", counting)
    return taken


T = TypeVar("T")


def _loop_off(monkeypatch, run: Callable[[], T]) -> T:
    """`run()`'s result with the greedy loop off: the runner's own steps take them all."""
    with monkeypatch.context() as patch:
        patch.setattr(ModelRunner, "_greedy_loop", lambda self, states: None)
        return run()


def _without_loop(monkeypatch, tiny_llama_dir, kv_cache_dtype: str, prompts: list[list[int]],
                  lengths: list[int]) -> list[list[int]]:
    """The tokens of the runner's own steps, one at a time (no greedy loop)."""
    return _loop_off(
        monkeypatch, lambda: _tokens(_llm(tiny_llama_dir, kv_cache_dtype, 1), prompts, lengths))


def _llm(tiny_llama_dir, kv_cache_dtype: str, num_scheduler_steps: int) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=256,
               kv_cache_dtype=kv_cache_dtype, num_scheduler_steps=num_scheduler_steps)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "auto"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_loop_gives_one_step_at_a_times_tokens(
    tiny_llama_dir, loop_steps, monkeypatch, variant, kv_cache_dtype
):
    lengths = [19, 7, 24, 12]  # the shortest caps a multi-step: 4, 3, 2... steps
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        want = _without_loop(monkeypatch, tiny_llama_dir, kv_cache_dtype, PROMPTS, lengths)
        assert not loop_steps
        alone = _tokens(_llm(tiny_llama_dir, kv_cache_dtype, 1), PROMPTS, lengths)
        assert loop_steps and set(loop_steps) == {1}  # every decode step, one a call
        loop_steps.clear()
        grouped = _tokens(_llm(tiny_llama_dir, kv_cache_dtype, 5), PROMPTS, lengths)
    assert alone == want
    assert grouped == want
    assert loop_steps and max(loop_steps) == 5  # a multi-step's steps all in the call


@pytest.mark.parametrize("arch, kv_cache_dtype", [("gemma3", "int8"), ("gemma3", "auto"),
                                                  ("mistral_window", "auto")])
def test_windowed_models_take_the_loop(
    tiny_arch_checkpoint, loop_steps, monkeypatch, arch, kv_cache_dtype
):
    """Gemma 3 (three KV cache groups, two of them 6-token windows; its embeddings scaled
    in the call) and Mistral (a 5-token window in one group), 4-token blocks: contexts
    run far past the windows, whose tables point the blocks left behind at the null
    block. A step alone and a multi-step's steps in the C call give the runner's own
    steps' tokens."""
    path = str(tiny_arch_checkpoint(arch))
    lengths = [40, 23, 33, 29]

    def tokens(num_scheduler_steps: int) -> list[list[int]]:
        llm = LLM(path, dtype="bfloat16", quantization="int4", max_model_len=256,
                  block_size=4, kv_cache_dtype=kv_cache_dtype,
                  num_scheduler_steps=num_scheduler_steps)
        return _tokens(llm, PROMPTS, lengths)

    want = _loop_off(monkeypatch, lambda: tokens(1))
    assert not loop_steps
    assert tokens(1) == want
    assert loop_steps and set(loop_steps) == {1}
    loop_steps.clear()
    assert tokens(8) == want
    assert max(loop_steps) == 8


def test_a_hybrid_model_in_the_loop_short_of_blocks(tiny_arch_checkpoint, loop_steps,
                                                    monkeypatch):
    """Gemma 3 with few KV blocks (25 of 4 tokens for four requests of up to 29): its
    windows give blocks back between the loop's calls and other requests take them, and
    requests are preempted and computed again. The loop's tokens are the runner's own
    steps' under the same grouping, and every block comes back."""
    path = str(tiny_arch_checkpoint("gemma3"))
    lengths = [20, 15, 18, 17]

    def engine() -> LLM:
        return LLM(path, dtype="bfloat16", quantization="int4", max_model_len=32,
                   block_size=4, num_gpu_blocks_override=25, num_scheduler_steps=8)

    want = _loop_off(monkeypatch, lambda: _tokens(engine(), PROMPTS, lengths))
    assert not loop_steps
    llm = engine()
    assert _tokens(llm, PROMPTS, lengths) == want
    assert loop_steps
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.num_preemptions > 0
    assert scheduler.kv_cache_manager.usage == 0.0


def test_more_rows_than_a_tile_and_blocks_crossed(tiny_llama_dir, loop_steps, monkeypatch):
    # 40 tokens of 16-token blocks: several multi-steps write into blocks the scheduler
    # allocated as lookahead slots.
    want = _without_loop(monkeypatch, tiny_llama_dir, "int8", MANY_PROMPTS, [40] * 10)
    got = _tokens(_llm(tiny_llama_dir, "int8", 8), MANY_PROMPTS, [40] * 10)
    assert got == want
    # The prefill's token, 4 multi-steps of 8 and a last one of the 7 tokens left.
    assert loop_steps == [8, 8, 8, 8, 7]


def test_the_loop_ends_at_a_stop_token(tiny_llama_dir, loop_steps, monkeypatch):
    """A row sampling one of its stop tokens ends the call: no step is computed past the
    request's end, and the tokens are one step at a time's up to the stop."""
    free = _without_loop(monkeypatch, tiny_llama_dir, "int8", [PROMPTS[0]], [30])[0]
    # a token first sampled at index 2..8: inside the first multi-step's C call (the
    # prefill samples index 0, the call indices 1..8)
    index = next(i for i in range(2, 9) if free[i] not in free[:i])
    params = SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[free[index]])
    llm = _llm(tiny_llama_dir, "int8", 8)
    (output,) = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params, use_tqdm=False)
    assert list(output.outputs[0].token_ids) == free[: index + 1]
    assert loop_steps == [index]  # indices 1..index, then the call returned


def _first_calls_not_finite(monkeypatch, calls: int) -> list[list[int]]:
    """Make the loop's first `calls` calls that step report their first step's first row
    non-finite (the call returns there); returns the true first steps they hid."""
    original = CpuDecodeStack.greedy_steps
    faked: list[list[int]] = []

    def failing(self, batch, steps, head, stop_ids=None):
        result = original(self, batch, steps, head, stop_ids)
        if result and len(faked) < calls:
            faked.append(result[0])
            return [[-1, *result[0][1:]]]  # the call returns at a non-finite row
        return result

    monkeypatch.setattr(CpuDecodeStack, "greedy_steps", failing)
    return faked


def test_a_first_step_the_loop_finds_not_finite_is_the_runners_own(
    tiny_llama_dir, monkeypatch
):
    """A row the loop's call marks non-finite in its first step: nothing of the step is
    kept, and the runner's own step takes it (which fails that request alone where the
    fault is real: tests/worker/test_nonfinite_requests.py). Faked here on the call's
    result: the tiny model's rows are finite, so the redone step gives the true tokens."""
    lengths = [6, 6]
    want = _without_loop(monkeypatch, tiny_llama_dir, "int8", PROMPTS[:2], lengths)
    faked = _first_calls_not_finite(monkeypatch, 1)
    llm = _llm(tiny_llama_dir, "int8", 1)
    assert _tokens(llm, PROMPTS[:2], lengths) == want
    assert faked
    assert llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.usage == 0.0


def test_a_first_extra_step_the_loop_finds_not_finite_is_the_runners_own(
    tiny_llama_dir, monkeypatch
):
    """The same rule where the loop begins a multi-step's extra steps (after the runner's
    own first step): a row its first step marks non-finite leaves that step to the runner
    instead of failing the request. Faked on the first two calls: the first (the whole
    step) sends the group's first step to the runner, the second (the extra steps) its
    second; the rows are finite, so every request still gets the true tokens."""
    lengths = [9, 9]
    want = _without_loop(monkeypatch, tiny_llama_dir, "int8", PROMPTS[:2], lengths)
    faked = _first_calls_not_finite(monkeypatch, 2)
    llm = _llm(tiny_llama_dir, "int8", 4)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], params,
                           use_tqdm=False)
    assert len(faked) == 2
    assert [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outputs] == [
        (tokens, "length") for tokens in want]
    assert llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.usage == 0.0


# -- whole steps beside everything else a batch may hold ------------------------------------


def _outputs(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple]:
    """Each request's tokens, finish reason and prompt logprobs (rounded)."""
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = []
    for output in outputs:
        prompt_logprobs = None if output.prompt_logprobs is None else [
            None if entry is None else sorted((t, round(v.logprob, 4)) for t, v in entry.items())
            for entry in output.prompt_logprobs
        ]
        completion = output.outputs[0]
        result.append((list(completion.token_ids), completion.finish_reason, prompt_logprobs))
    return result


MIXED_PROMPTS = [[5, 17, 42, 8, 99, 3], [7], [101, 55, 23, 61, 9, 14, 30, 2, 77], [4, 44],
                 [9, 9, 9, 9, 9, 9, 9]]
MIXED_PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=20, prompt_logprobs=2),
    SamplingParams(temperature=0.0, max_tokens=20, min_tokens=6),
    SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, prompt_logprobs=1),
    SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True),
]


@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("engine", [
    {"max_num_batched_tokens": 3, "enable_chunked_prefill": True},  # prompts in 1-3 tokens
    {"block_size": 4, "num_gpu_blocks_override": 20, "max_model_len": 64},  # preemptions
], ids=["chunked", "preempted"])
def test_whole_steps_beside_prompts_chunks_and_preemption(
    tiny_llama_dir, loop_steps, monkeypatch, engine, steps
):
    """A one-token prompt, prompt logprobs, min_tokens with EOS, prompts chunked a few
    tokens a step, preemption and resumption: the same outputs as the runner's own steps,
    the loop taking the plain decode steps among them, twice over the same engine (the
    second time from the prefix cache)."""
    def engine_of() -> LLM:
        return LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4",
                   num_scheduler_steps=steps, **{"max_model_len": 128, **engine})

    want = _loop_off(monkeypatch, lambda: _outputs(engine_of(), MIXED_PROMPTS, MIXED_PARAMS))
    assert not loop_steps
    llm = engine_of()
    assert _outputs(llm, MIXED_PROMPTS, MIXED_PARAMS) == want
    assert _outputs(llm, MIXED_PROMPTS, MIXED_PARAMS) == want
    assert loop_steps
    assert llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.usage == 0.0


@pytest.mark.parametrize("case", ["a table outgrows the kept columns",
                                  "a narrower table over a wider one's columns"])
def test_the_kept_arrays_as_tables_and_rows_change(
    tiny_llama_dir, loop_steps, monkeypatch, case
):
    """The call's kept arrays (cpu_stack._GreedyCall) made again as a context outgrows their
    block table columns and as the batch's rows change; and kept where a short request
    takes a long one's row, the long table's columns left behind unread."""
    if case == "a table outgrows the kept columns":  # 64 columns of 4 tokens, then 70
        prompts, lengths, kwargs = [[3 + i % 50 for i in range(20)], [7, 8]], [260, 30], {
            "num_scheduler_steps": 8}
    else:  # two seats: the 300-token request's row goes to the third request
        prompts = [[3 + (7 * i) % 280 for i in range(300)], [7, 8, 9], [11] * 20]
        lengths, kwargs = [10, 60, 60], {"num_scheduler_steps": 1, "max_num_seqs": 2}

    def engine_of() -> LLM:
        return LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4",
                   max_model_len=512, block_size=4, **kwargs)

    want = _loop_off(monkeypatch, lambda: _tokens(engine_of(), prompts, lengths))
    made: list[tuple[int, int]] = []
    original = cpu_stack._GreedyCall.__init__

    def recording(self, dims, rows, steps, num_groups, max_blocks):
        made.append((rows, max_blocks))
        original(self, dims, rows, steps, num_groups, max_blocks)

    monkeypatch.setattr(cpu_stack._GreedyCall, "__init__", recording)
    assert _tokens(engine_of(), prompts, lengths) == want
    assert loop_steps
    if case == "a table outgrows the kept columns":
        assert [rows for rows, _ in made] == [2, 1, 1]  # two rows, one, then wider
        assert made[-1][1] > 64
    else:
        # the two-row arrays made for the long table, kept for the short one after it,
        # then one row
        assert [rows for rows, _ in made] == [2, 1] and made[0][1] > 64


def test_a_row_failing_inside_a_whole_step_keeps_the_tokens_before(
    tiny_llama_dir, monkeypatch
):
    """A row the call marks non-finite at its second step: its request fails with the
    tokens of the steps before (as in a multi-step's extra steps), its neighbour goes on
    to the tokens of the runner's own steps, and every block comes back."""
    lengths = [10, 10]
    want = _without_loop(monkeypatch, tiny_llama_dir, "int8", PROMPTS[:2], lengths)
    original = CpuDecodeStack.greedy_steps
    faked: list[bool] = []

    def failing_at_the_second_step(self, batch, steps, head, stop_ids=None):
        result = original(self, batch, steps, head, stop_ids)
        if result and len(result) >= 2 and not faked:
            faked.append(True)
            return [result[0], [-1, *result[1][1:]]]  # the call returns at that step
        return result

    monkeypatch.setattr(CpuDecodeStack, "greedy_steps", failing_at_the_second_step)
    llm = _llm(tiny_llama_dir, "int8", 4)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], params,
                           use_tqdm=False)
    assert faked
    failed, neighbour = (o.outputs[0] for o in outputs)
    # the prefill's token and the call's first step's
    assert (list(failed.token_ids), failed.finish_reason) == (want[0][:2], "error")
    assert (list(neighbour.token_ids), neighbour.finish_reason) == (want[1], "length")
    assert llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.usage == 0.0


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=6, logprobs=1),
    SamplingParams(temperature=0.8, max_tokens=6, seed=1),
    SamplingParams(temperature=0.0, max_tokens=6, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, max_tokens=6, logit_bias={5: 2.0}),
], ids=["logprobs", "sampled", "penalty", "logit_bias"])
def test_steps_the_loop_does_not_take(tiny_llama_dir, loop_steps, params):
    """Requests that need more than the argmax keep their steps in the runner's own."""
    llm = _llm(tiny_llama_dir, "int8", 1)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert not loop_steps
