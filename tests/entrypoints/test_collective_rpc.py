"""LLM.collective_rpc (vLLM's): a Worker method by name or a function run on every worker
between steps, one result per worker; bad methods are a ValueError and the engine keeps
serving. Several ranks: tests/executor/test_multiproc_executor.py."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    engine = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128,
                 kv_cache_memory_bytes=2**21)
    yield engine
    engine.llm_engine.shutdown()


def _num_kv_blocks(worker, scale=1):
    return worker.kv_cache_spec.num_blocks * scale


def test_method_by_name_and_function_with_args(llm):
    # By name: the worker's own method runs (and its ValueError comes back as one).
    with pytest.raises(ValueError, match="LoRA is off"):
        llm.collective_rpc("list_loras")
    blocks = llm.llm_engine.engine_core.engine_core.executor.kv_cache_spec.num_blocks
    assert llm.collective_rpc(_num_kv_blocks) == [blocks]
    assert llm.collective_rpc(_num_kv_blocks, args=(2,)) == [2 * blocks]
    assert llm.collective_rpc(lambda worker, scale: _num_kv_blocks(worker, scale),
                              kwargs={"scale": 3}) == [3 * blocks]


@pytest.mark.parametrize("method, text", [
    ("no_such_method", "no public method 'no_such_method'"),
    ("_allocate_kv_caches", "no public method"),
    (42, "method must be"),
])
def test_bad_methods_are_value_errors_and_the_engine_lives(llm, method, text):
    with pytest.raises(ValueError, match=text):
        llm.collective_rpc(method)
    out = llm.generate("hello", SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_a_failing_function_is_reported(llm):
    def boom(worker):
        raise RuntimeError("boom from the worker")

    with pytest.raises(RuntimeError, match="boom from the worker"):
        llm.collective_rpc(boom)
    assert llm.collective_rpc(_num_kv_blocks) == [llm.collective_rpc(_num_kv_blocks)[0]]
