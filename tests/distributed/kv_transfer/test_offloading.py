"""OffloadingConnector (--kv-offloading-size / --kv-offloading-path): prompt blocks the KV
cache evicted come back from the second tier instead of being computed again, token for
token; the tier keeps its size (least recently used out); on disk it outlives the engine
(a restarted engine answers a repeated prompt from it); beside a shared folder, both make a
MultiConnector."""

from __future__ import annotations

import os

import pytest

from pagedllm import LLM, SamplingParams

BLOCK = 16
SYSTEM = [7, 3, 11, 5] * 16  # a 64-token "system prompt": 4 full blocks
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _run(llm, prompts):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], [o.num_cached_tokens
                                                             for o in outputs]


def _engine(model_dir, **kwargs):
    # A KV cache of 12 usable blocks: other prompts soon evict the system prompt's.
    return LLM(str(model_dir), dtype="float32", max_model_len=192, block_size=BLOCK,
               num_gpu_blocks_override=13, enable_prefix_caching=True, **kwargs)


@pytest.fixture(scope="module")
def expected(tiny_llama_dir):
    plain = _engine(tiny_llama_dir)
    try:
        return _run(plain, [SYSTEM + [30, 31]])[0][0]
    finally:
        plain.llm_engine.shutdown()


def _evict(llm):
    # Prompts that fill the KV cache with other blocks.
    _run(llm, [[100 + i, 101, 102, 103] * 40 for i in range(2)])  # 160 tokens each


def test_evicted_prefix_comes_back_from_host_memory(tiny_llama_dir, expected):
    llm = _engine(tiny_llama_dir, kv_offloading_size=0.01)
    try:
        tokens, cached = _run(llm, [SYSTEM + [30, 31]])
        assert tokens == [expected] and cached == [0]
        _evict(llm)
        tokens, cached = _run(llm, [SYSTEM + [30, 31]])
        assert tokens == [expected] and cached == [64]  # from the tier, not the KV cache
    finally:
        llm.llm_engine.shutdown()


def test_the_tier_keeps_its_size(tiny_llama_dir, tmp_path):
    llm = _engine(tiny_llama_dir, kv_offloading_size=1e-5, kv_offloading_path=str(tmp_path))
    try:
        core = llm.llm_engine.engine_core.engine_core
        connector = core.scheduler.kv_connector
        bytes_per_block = core.executor.kv_cache_spec.bytes_per_block
        assert connector.capacity == max(1, int(1e-5 * 2**30) // bytes_per_block) < 4
        _run(llm, [SYSTEM + [30, 31]])  # 4 blocks saved: only the newest stay
        assert len(os.listdir(tmp_path)) == connector.capacity
    finally:
        llm.llm_engine.shutdown()


def test_a_restarted_engine_answers_from_the_disk_tier(tiny_llama_dir, tmp_path, expected):
    first = _engine(tiny_llama_dir, kv_offloading_size=0.01, kv_offloading_path=str(tmp_path))
    try:
        _run(first, [SYSTEM + [30, 31]])
    finally:
        first.llm_engine.shutdown()
    assert len(os.listdir(tmp_path)) == 4
    second = _engine(tiny_llama_dir, kv_offloading_size=0.01, kv_offloading_path=str(tmp_path))
    try:
        tokens, cached = _run(second, [SYSTEM + [30, 31]])
        assert tokens == [expected] and cached == [64]
    finally:
        second.llm_engine.shutdown()


def test_offloading_options_are_checked(tiny_llama_dir, tmp_path):
    with pytest.raises(ValueError, match="needs kv_offloading_size"):
        LLM(str(tiny_llama_dir), kv_offloading_path=str(tmp_path))


def test_offloading_beside_a_shared_folder_is_a_multi_connector(tiny_llama_dir, tmp_path,
                                                                expected):
    folder = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "shared")}}
    first = _engine(tiny_llama_dir, kv_transfer_config=folder)
    try:
        _run(first, [SYSTEM + [30, 31]])  # the folder gets the 4 blocks
    finally:
        first.llm_engine.shutdown()
    second = _engine(tiny_llama_dir, kv_transfer_config=folder, kv_offloading_size=0.01)
    try:
        connector = second.llm_engine.engine_core.engine_core.scheduler.kv_connector
        assert [type(c).__name__ for c in connector.connectors] == [
            "SharedStorageConnector", "OffloadingConnector"]
        tokens, cached = _run(second, [SYSTEM + [30, 31]])
        assert tokens == [expected] and cached == [64]  # from the folder
        other = [50, 51, 52, 53] * 12
        _run(second, [other])  # computed: saved to both the folder and the tier
        assert connector.connectors[1].has(
            second.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
            .block_hashes(_probe(other))[0].hex())
    finally:
        second.llm_engine.shutdown()


def _probe(tokens):
    from pagedllm.request import Request, RequestData

    return Request("probe", RequestData(tokens, PARAMS))


@pytest.mark.parametrize("extra, text", [
    ({"connectors": [{"kv_connector": "SharedStorageConnector"}]}, "at least two"),
    ({"connectors": [{"kv_connector": "MultiConnector"}, {"kv_connector": "ExampleConnector"}]},
     "MultiConnector"),
])
def test_bad_multi_connectors(tiny_llama_dir, extra, text):
    with pytest.raises(ValueError, match=text):
        LLM(str(tiny_llama_dir), kv_transfer_config={
            "kv_connector": "MultiConnector", "kv_connector_extra_config": extra})


def test_the_host_tier_survives_a_level_2_sleep(tiny_llama_dir, expected):
    llm = _engine(tiny_llama_dir, kv_offloading_size=0.01, enable_sleep_mode=True)
    try:
        _run(llm, [SYSTEM + [30, 31]])
        llm.sleep(level=2)  # weights and KV cache given back; the tier is kept
        llm.wake_up()
        tokens, cached = _run(llm, [SYSTEM + [30, 31]])
        assert tokens == [expected] and cached == [64]  # from the tier
    finally:
        llm.llm_engine.shutdown()
