"""kv_cache_dtype: how it is resolved, what the worker allocates, and end-to-end consistency.

Attention always reads K/V back from the int8 rows (new tokens included), so in float32 a
request's greedy output with an int8 cache must not depend on how its prompt was split
into steps, on prefix caching, or on preemption.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.attention import kv_quant
from pagedllm.engine.arg_utils import EngineArgs


def _cache_dtype(model_dir, **kwargs) -> str:
    config = EngineArgs(model=str(model_dir), device="cpu", **kwargs).create_engine_config()
    return config.cache_config.cache_dtype


def test_default_is_the_models_dtype_and_int8_is_asked_for(tiny_llama_dir):
    """As vLLM: the cache keeps the model's dtype unless kv_cache_dtype says otherwise
    (int8 measured no faster and less exact on the default model: arg_utils)."""
    for dtype, quantization in [("bfloat16", "int4"), ("bfloat16", "int8"),
                                ("bfloat16", "none"), ("float32", "int8")]:
        assert _cache_dtype(tiny_llama_dir, dtype=dtype, quantization=quantization) == "auto"
    assert _cache_dtype(tiny_llama_dir, dtype="bfloat16", quantization="int4",
                        kv_cache_dtype="int8") == "int8"
    assert _cache_dtype(tiny_llama_dir, dtype="float32", kv_cache_dtype="int8") == "int8"


@pytest.mark.parametrize("value", ["fp8", "fp8_e4m3", "int4"])
def test_unsupported_kv_cache_dtype_is_rejected(tiny_llama_dir, value):
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        LLM(str(tiny_llama_dir), kv_cache_dtype=value)


def _worker(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.executor.worker


def test_int8_cache_layout_and_block_budget(tiny_llama_dir):
    budget = 4 << 20
    llms = {
        kind: LLM(
            str(tiny_llama_dir), dtype="bfloat16", max_model_len=128,
            kv_cache_memory_bytes=budget, kv_cache_dtype=kind,
        )
        for kind in ("auto", "int8")
    }
    dense, int8 = _worker(llms["auto"]), _worker(llms["int8"])
    head_size = dense.model_runner.kv_caches[0].shape[-1]
    for cache in int8.model_runner.kv_caches:
        assert cache.dtype == torch.int8
        assert cache.shape[-1] == kv_quant.cache_row_size(head_size)
        assert not cache[:, 0].any()  # the null block
    layers = len(int8.model_runner.kv_caches)
    one_block = math.prod(int8.model_runner.kv_caches[0][:, :1].shape)
    assert int8.kv_cache_spec.bytes_per_block == layers * one_block
    assert int8.kv_cache_spec.num_blocks == budget // int8.kv_cache_spec.bytes_per_block
    # bf16 rows of 2 * D bytes against D + D / 4: the same budget holds more int8 blocks.
    ratio = int8.kv_cache_spec.num_blocks / dense.kv_cache_spec.num_blocks
    assert ratio == pytest.approx(2 * head_size / kv_quant.cache_row_size(head_size), rel=0.02)


_RNG = random.Random(0)
# Short prompts with long outputs: all are admitted at once, then outgrow a small cache.
PROMPTS = [[_RNG.randrange(3, 200) for _ in range(n)] for n in (21, 18, 37, 19)]


def _greedy(llm: LLM, prompts=PROMPTS, max_tokens: int = 40) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _int8_llm(model_dir, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 128)
    return LLM(str(model_dir), dtype="float32", kv_cache_dtype="int8", **kwargs)


def test_int8_outputs_do_not_depend_on_chunking_caching_or_preemption(tiny_llama_dir):
    whole = _greedy(_int8_llm(tiny_llama_dir, enable_prefix_caching=False))
    chunked = _greedy(_int8_llm(tiny_llama_dir, max_num_batched_tokens=8))
    assert chunked == whole
    cached = _int8_llm(tiny_llama_dir, block_size=4)
    _greedy(cached)
    assert _greedy(cached) == whole  # second run reads the prompts' blocks from the cache
    for mode in ("recompute", "swap"):
        small = _int8_llm(
            tiny_llama_dir, block_size=4, num_gpu_blocks_override=34, preemption_mode=mode,
            swap_space=0.01,
        )
        assert _greedy(small) == whole
        assert small.llm_engine.engine_core.engine_core.scheduler.num_preemptions > 0
