"""The CPU decode stack (worker/decode_step/cpu_stack.py): which models and steps it takes,
and that it changes no result.

It chains the same C kernels as the Python layers in the same order, so a run with it and a
run without it (same engine, same weights) must agree bit for bit: tokens and logprobs.
"""

from __future__ import annotations

import math

import pytest

from pagedllm import LLM, SamplingParams, kernels
from pagedllm.kernels.variants import runnable_variants
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import Bf16PanelWeight, CrossoverMethod, W4A8Weight
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect
from pagedllm.worker.decode_step import cpu_stack
from pagedllm.worker.decode_step.cpu_stack import CpuDecodeStack

pytestmark = pytest.mark.skipif(
    cpu_stack._library() is None or not cpu_ops.w4a8_available(),
    reason="no C compiler",
)

PROMPTS = [[5, 17, 42, 8, 99, 3], [7, 7, 12], [101, 55, 23, 61, 9, 14, 30, 2, 77], [4, 44]]
# More requests than the matmul kernel's tile of 8 tokens, all in one decode step.
MANY_PROMPTS = [[i + 3, 2 * i + 5, 11] for i in range(10)]


def _runner(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.executor.worker.model_runner


def _model(llm: LLM):
    return _runner(llm).model


@pytest.fixture(scope="module", params=["int8", "auto"], ids=["int8_kv", "bf16_kv"])
def llm(request, tiny_llama_dir) -> LLM:
    """A quantized checkpoint on CPU: bfloat16, int4 (W4A8), an int8 or a bfloat16 KV
    cache (the stack reads both)."""
    return LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=256,
               kv_cache_dtype=request.param)


def _generate(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    results = []
    for output in outputs:
        completion = output.outputs[0]
        pairs = zip(completion.logprobs, completion.token_ids, strict=True)
        logprobs = [entry[token].logprob for entry, token in pairs]
        results.append((list(completion.token_ids), logprobs))
    return results


def _generate_without_stack(llm: LLM, prompts: list[list[int]]):
    """`_generate` with the runner's stack switched off for the call (the layer loop)."""
    runner = _runner(llm)
    stack, runner.decode_step = runner.decode_step, None
    try:
        return _generate(llm, prompts)
    finally:
        runner.decode_step = stack


def test_default_quantized_model_gets_the_stack(llm):
    stack = _runner(llm).decode_step
    assert isinstance(stack, CpuDecodeStack)
    assert isinstance(_model(llm).model.layers[0].mlp.down_proj.quantized, W4A8Weight)
    # The whole decoder in the call: the embedding lookup and the final norm too.
    assert stack.dims.embedding and stack.dims.final_norm


def test_a_token_id_outside_the_vocabulary_is_refused_before_anything_runs(llm):
    import numpy as np

    from pagedllm.worker.decode_step.base import DecodeBatch

    stack = _runner(llm).decode_step
    ids = np.array([stack.dims.vocab_size], dtype=np.int64)
    batch = DecodeBatch(ids, np.zeros(1, np.int64), np.zeros(1, np.int64),
                        np.zeros((1, 1), np.int32))
    with pytest.raises(IndexError, match="outside the vocabulary"):
        stack.run(batch)


class StackCalls(list):
    """The token counts of the decode-only steps the stack ran; `mixed`: of the others
    (prefill chunks, with or without decodes)."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[int] = []


@pytest.fixture
def stack_calls(monkeypatch) -> StackCalls:
    """The token count of every step the stack runs (it still runs them)."""
    calls = StackCalls()
    original = CpuDecodeStack.run

    def counting(self, batch):
        (calls if batch.requests is None else calls.mixed).append(batch.num_rows)
        return original(self, batch)

    monkeypatch.setattr(CpuDecodeStack, "run", counting)
    return calls


@pytest.mark.parametrize(
    "prompts", [PROMPTS[:1], PROMPTS, MANY_PROMPTS], ids=["one", "four", "ten"]
)
def test_stack_output_is_bit_identical_to_the_python_layers(llm, stack_calls, prompts):
    stack = _runner(llm).decode_step
    if stack.max_tokens is not None and stack.max_tokens < len(prompts):
        # The dense/int4 crossover is measured at load; on a busy machine it may send a
        # step this wide to the dense weights, which the stack leaves to the layers.
        pytest.skip(f"the measured crossover ({stack.max_tokens} rows) is below this step")
    calls = stack_calls
    with_stack = _generate(llm, prompts)
    # The decode steps ran on it (each prompt has more than one token: no prefill did).
    assert calls and max(calls) == len(prompts)
    assert _generate_without_stack(llm, prompts) == with_stack


# The stack runs on the vector variants (the scalar build leaves quantized steps to torch).
VARIANTS = [v.name for v in runnable_variants(detect()) if v.simd]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "auto"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_kernel_variant_gives_the_layer_loops_output(
    tiny_llama_dir, stack_calls, variant, kv_cache_dtype
):
    """On each vector variant this CPU runs (AVX-512, AVX2...), with either cache, the
    stack still agrees bit for bit with the Python layers of the same variant: decode
    steps, and (a budget of 6 tokens) prefill chunks beside decodes."""
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4",
                  max_model_len=256, kv_cache_dtype=kv_cache_dtype,
                  max_num_batched_tokens=6, max_num_seqs=4, enable_chunked_prefill=True)
        assert isinstance(_runner(llm).decode_step, CpuDecodeStack)
        with_stack = _generate(llm, PROMPTS)
        assert stack_calls and stack_calls.mixed
        assert _generate_without_stack(llm, PROMPTS) == with_stack


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "auto"])
def test_mixed_steps_run_on_the_stack_bit_identically(
    tiny_llama_dir, stack_calls, kv_cache_dtype
):
    """A step budget of 6 tokens: prompts are prefilled in chunks beside other requests'
    decodes (chunks after the prompt's earlier chunks among them), and those mixed steps
    run on the stack, with the layer loop's tokens and logprobs."""
    small_steps = LLM(
        str(tiny_llama_dir), dtype="bfloat16", quantization="int4",
        max_model_len=256, max_num_batched_tokens=6, max_num_seqs=4,
        enable_chunked_prefill=True, kv_cache_dtype=kv_cache_dtype,
    )
    prompts = [*PROMPTS, PROMPTS[2] + [5, 6, 7, 8]]
    with_stack = _generate(small_steps, prompts)
    assert all(len(tokens) == 24 for tokens, _ in with_stack)
    # Steps with prefill chunks ran on it, and decode-only steps.
    assert stack_calls and stack_calls.mixed and max(stack_calls.mixed) == 6
    assert _generate_without_stack(small_steps, prompts) == with_stack


def test_models_outside_its_scope_run_without_it(tiny_llama_dir, tiny_arch_checkpoint):
    float32 = LLM(str(tiny_llama_dir), dtype="float32", quantization="int4", max_model_len=128)
    # Weight-only int8 (torch's kernel): not a byte dot-product weight.
    int8 = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int8", max_model_len=128)
    for llm in (float32, int8):
        assert _runner(llm).decode_step is None


def _check_against_the_layer_loop(llm: LLM, stack_calls: list[int]) -> None:
    """The stack runs the batched decode steps, and the same requests without it give the
    same tokens and logprobs."""
    stack = _runner(llm).decode_step
    assert isinstance(stack, CpuDecodeStack)
    assert stack.dims.final_norm  # the model's final norm runs in the same call
    # ... and the embeddings are looked up (and scaled: Gemma) in it, but for learned
    # positions (GPT-2, OPT), which the caller adds
    assert bool(stack.dims.embedding) == (stack.decoder.embed_positions is None)
    scale = stack.decoder.embed_scale
    if scale is not None:  # Gemma's sqrt(96) in bfloat16 (9.8125): the product rounds
        assert stack.dims.embedding_scale == float(scale) and math.frexp(float(scale))[0] != 0.5
    with_stack = _generate(llm, PROMPTS)
    assert stack_calls and max(stack_calls) == len(PROMPTS)
    assert _generate_without_stack(llm, PROMPTS) == with_stack


# Each adds what the C loop must do beyond Llama's layer: Qwen2 q/k/v biases, Qwen3 per-head
# q/k norms, Gemma 3 (1 + w) and sandwich norms, q/k norms, GeGLU, two RoPE tables and three
# KV cache groups (two 6-token windows, one global), Mistral a window in one group, GPT-2
# LayerNorms with biases, learned positions and a plain GELU MLP, OPT the same with ReLU;
# the MoE models their experts (csrc/moe.c): Mixtral renormalised top-2, Qwen2-MoE a shared
# expert and a dense layer beside a sparse one, Qwen3-MoE q/k norms too.
ARCHITECTURES = [("qwen2", "auto"), ("qwen3", "auto"), ("gemma3", "auto"), ("gemma3", "int8"),
                 ("mistral_window", "int8"), ("gpt2", "auto"), ("opt", "int8"),
                 ("mixtral", "auto"), ("qwen2_moe", "int8"), ("qwen3_moe", "auto")]


@pytest.mark.parametrize("arch, kv_cache_dtype", ARCHITECTURES)
def test_every_served_architecture_gives_the_layer_loops_output(
    tiny_arch_checkpoint, stack_calls, arch, kv_cache_dtype
):
    """Tokens and logprobs equal with and without the stack, batched, past the windows."""
    llm = LLM(str(tiny_arch_checkpoint(arch)), dtype="bfloat16", quantization="int4",
              max_model_len=256, kv_cache_dtype=kv_cache_dtype)
    _check_against_the_layer_loop(llm, stack_calls)


@pytest.mark.parametrize("arch, kv_cache_dtype", [("gemma3", "int8"), ("gemma3", "auto"),
                                                  ("mistral_window", "auto")])
def test_chunked_prefills_with_windows_and_groups_give_the_layer_loops_output(
    tiny_arch_checkpoint, stack_calls, arch, kv_cache_dtype
):
    """Mixed steps of 7 tokens on sliding-window layers (Gemma 3: three KV cache groups, two
    of them 6-token windows; Mistral: one windowed group): the chunks cross the windows, and
    tokens and logprobs equal the layer loop's."""
    llm = LLM(str(tiny_arch_checkpoint(arch)), dtype="bfloat16", quantization="int4",
              max_model_len=256, kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=7,
              max_num_seqs=4, enable_chunked_prefill=True)
    prompts = [*PROMPTS, [i % 50 + 3 for i in range(20)]]  # a prompt of 3 chunks
    with_stack = _generate(llm, prompts)
    assert stack_calls.mixed and max(stack_calls.mixed) == 7
    assert _generate_without_stack(llm, prompts) == with_stack


def test_switched_off_by_environment(monkeypatch, tiny_llama_dir):
    monkeypatch.setenv("PAGEDLLM_DECODE_STACK", "python")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=128)
    assert _runner(llm).decode_step is None
    monkeypatch.delenv("PAGEDLLM_DECODE_STACK")
    assert cpu_stack._library() is not None


@pytest.mark.parametrize("variant", VARIANTS)
def test_dense_bfloat16_weights_run_on_the_stack_as_the_layer_loop(
    tiny_llama_dir, stack_calls, bf16_panels, variant
):
    """No quantization: the matrices are bfloat16 panels (csrc/bf16_matmul.c), and decode
    and mixed steps (a budget of 6 tokens) run on the stack with the layer loop's tokens
    and logprobs, on each vector variant."""
    bf16_panels("always")
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256,
                  max_num_batched_tokens=6, max_num_seqs=4, enable_chunked_prefill=True)
        down_proj = _model(llm).model.layers[0].mlp.down_proj
        assert isinstance(down_proj.method, Bf16PanelWeight) and down_proj.quantized is None
        assert isinstance(_runner(llm).decode_step, CpuDecodeStack)
        with_stack = _generate(llm, PROMPTS)
        assert stack_calls and stack_calls.mixed
        assert _generate_without_stack(llm, PROMPTS) == with_stack


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "qwen2_moe"])
def test_dense_bfloat16_layer_kinds_run_on_the_stack_as_the_layer_loop(
    tiny_arch_checkpoint, stack_calls, bf16_panels, arch
):
    """Dense bf16 panels with Qwen2's q/k/v biases, Gemma 3's norms, windows and GeGLU,
    and Qwen2-MoE's dense router and experts beside them (the experts stay torch's where no
    kernel takes them): tokens and logprobs equal with and without the stack."""
    bf16_panels("always")
    llm = LLM(str(tiny_arch_checkpoint(arch)), dtype="bfloat16", max_model_len=256)
    _check_against_the_layer_loop(llm, stack_calls)


def test_dense_panels_up_to_a_step_size_serve_the_stack_for_those_steps(
    tiny_llama_dir, stack_calls, bf16_panels
):
    """Where the panels win small steps only (matrix units), dense layers hold them beside
    torch's weight: the stack takes the steps up to that size, the layer loop the others,
    with the same tokens and logprobs as the layer loop throughout."""
    bf16_panels("3")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256)
    runner = _runner(llm)
    down_proj = runner.model.model.layers[0].mlp.down_proj
    assert isinstance(down_proj.method, CrossoverMethod) and down_proj.quantized is None
    assert runner.decode_step.max_tokens == 3
    with_stack = [_generate(llm, prompts) for prompts in (PROMPTS[:2], MANY_PROMPTS)]
    assert stack_calls == [2] * 23  # the 2-request decode steps; the 10-request ones ran dense
    without = [_generate_without_stack(llm, prompts) for prompts in (PROMPTS[:2], MANY_PROMPTS)]
    assert without == with_stack


def test_no_stack_for_dense_weights_left_to_torch(tiny_llama_dir, bf16_panels):
    bf16_panels("never")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=128)
    assert _runner(llm).decode_step is None


def test_steps_for_kept_dense_weights_run_the_python_layers(
    tiny_llama_dir, dense_from_tokens, bf16_panels, stack_calls
):
    """Where dense bf16 wins from some step size (CPUs with matrix units), the layers keep
    dense weights for such steps and, without panels, the stack takes only the smaller
    ones."""
    dense_from_tokens("4")
    bf16_panels("never")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=256)
    runner = _runner(llm)
    assert runner.model.model.layers[0].mlp.down_proj.keeps_dense
    assert runner.decode_step.max_tokens == 3
    with_stack = [_generate(llm, prompts) for prompts in (PROMPTS[:2], MANY_PROMPTS)]
    assert stack_calls == [2] * 23  # the 2-request decode steps; the 10-request ones ran dense
    without = [_generate_without_stack(llm, prompts) for prompts in (PROMPTS[:2], MANY_PROMPTS)]
    assert without == with_stack


@pytest.mark.parametrize(("panels", "max_tokens", "decode_rows"), [
    ("8", 8, [4] * 23),  # the 10-request steps past the panels: torch's dense weight
    ("always", None, [4] * 23 + [10] * 23),
])
def test_large_steps_of_quantized_layers_run_their_panels_on_the_stack(
    tiny_llama_dir, dense_from_tokens, bf16_panels, stack_calls, panels, max_tokens,
    decode_rows,
):
    """On matrix units a quantized layer's large steps run as an unquantized layer's: bf16
    panels where they serve, which the stack multiplies in its one call (the matrix's
    `large` weight), bit for bit as the layer loop."""
    dense_from_tokens("4")
    bf16_panels(panels)
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=256)
    runner = _runner(llm)
    method = runner.model.model.layers[0].mlp.down_proj.method
    assert isinstance(method, CrossoverMethod) and method.max_tokens == 3
    large = method.large if panels == "always" else method.large.small
    assert isinstance(large, Bf16PanelWeight)
    assert runner.decode_step.max_tokens == max_tokens
    with_stack = [_generate(llm, prompts) for prompts in (PROMPTS, MANY_PROMPTS)]
    assert stack_calls == decode_rows
    without = [_generate_without_stack(llm, prompts) for prompts in (PROMPTS, MANY_PROMPTS)]
    assert without == with_stack


@pytest.mark.parametrize("arch", ["gemma3", "gpt2", "qwen2_moe"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_kernel_variant_runs_the_other_layer_kinds_as_the_layer_loop(
    tiny_arch_checkpoint, stack_calls, variant, arch
):
    """Sandwich and q/k norms, GeGLU and windows (Gemma 3), LayerNorm and a plain MLP
    (GPT-2), experts and a shared expert (Qwen2-MoE): on each vector variant this CPU runs,
    bit for bit as the Python layers of the same variant."""
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        llm = LLM(str(tiny_arch_checkpoint(arch)), dtype="bfloat16", quantization="int4",
                  max_model_len=256)
        _check_against_the_layer_loop(llm, stack_calls)
