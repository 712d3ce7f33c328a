"""SharedStorageConnector (vLLM's example connector): one engine saves its prompts' full
blocks to a folder, another (fresh, its own process memory) loads them instead of
computing them, and gives the same greedy tokens; blocks already on disk are not written
again; kv_transfer_config errors name the field."""

from __future__ import annotations

import os

import pytest

from pagedllm import LLM, SamplingParams

BLOCK = 16
SHARED = [7, 3, 11, 5] * 9  # 36 tokens: 2 full blocks shared by the first two prompts
PROMPTS = [SHARED + [21, 22, 23], SHARED + [40, 41, 42, 43, 44, 45, 46, 47, 48, 49],
           [9, 8, 7, 6, 5] * 8]
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def _engine(model_dir, folder, role="kv_both", kv_load_failure_policy="fail", **kwargs):
    config = {"kv_connector": "SharedStorageConnector", "kv_role": role,
              "kv_load_failure_policy": kv_load_failure_policy,
              "kv_connector_extra_config": {"shared_storage_path": str(folder)}}
    return LLM(str(model_dir), dtype="float32", max_model_len=256, block_size=BLOCK,
               kv_transfer_config=config, **kwargs)


def _run(llm, prompts=PROMPTS):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], [o.num_cached_tokens
                                                             for o in outputs]


def test_a_second_engine_loads_the_first_ones_blocks(tiny_llama_dir, tmp_path):
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256, block_size=BLOCK)
    try:
        expected, _ = _run(plain)
    finally:
        plain.llm_engine.shutdown()
    producer = _engine(tiny_llama_dir, tmp_path, "kv_producer")
    try:
        tokens, _ = _run(producer)
    finally:
        producer.llm_engine.shutdown()
    assert tokens == expected
    # Full prompt blocks, each once: 2 shared by the first two prompts + 2 of the third.
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 4 and all(f.endswith(".safetensors") for f in files)
    consumer = _engine(tiny_llama_dir, tmp_path, "kv_consumer", enable_prefix_caching=False)
    try:
        tokens, cached = _run(consumer)
    finally:
        consumer.llm_engine.shutdown()
    assert tokens == expected
    # Loaded from the folder (no local cache): every full block but one holding the last
    # prompt token, whose logits must be computed.
    assert cached == [32, 32, 32]
    assert sorted(os.listdir(tmp_path)) == files  # a consumer writes nothing


def test_both_roles_and_a_longer_prompt_after_a_shorter_one(tiny_llama_dir, tmp_path):
    first = _engine(tiny_llama_dir, tmp_path)
    try:
        _run(first, PROMPTS[:1])
        assert len(os.listdir(tmp_path)) == 2
    finally:
        first.llm_engine.shutdown()
    longer = SHARED + list(range(60, 80))  # 56 tokens: 3 full blocks
    second = _engine(tiny_llama_dir, tmp_path, enable_prefix_caching=True)
    try:
        tokens, cached = _run(second, [longer])
        assert cached == [32]  # the shared blocks came from disk
        assert len(os.listdir(tmp_path)) == 3  # and it saved its own third block
        again, cached_again = _run(second, [longer])
        assert again == tokens and cached_again == [48]  # now all from its own cache
    finally:
        second.llm_engine.shutdown()


@pytest.mark.parametrize("config, text", [
    ({"kv_connector": "NoSuchConnector"}, "NoSuchConnector"),
    ({"kv_connector": "SharedStorageConnector", "kv_role": "kv_sender"}, "kv_role"),
    ({"kv_connector": "SharedStorageConnector", "kv_rol": "kv_both"},
     "unknown keys \\['kv_rol'\\]"),
    ({"kv_connector": "SharedStorageConnector", "kv_load_failure_policy": "ignore"},
     "kv_load_failure_policy"),
    ({"kv_role": "kv_both"}, "needs kv_connector"),
    ("{oops", "not valid JSON"),
])
def test_bad_configs_name_the_field(tiny_llama_dir, config, text):
    with pytest.raises(ValueError, match=text):
        LLM(str(tiny_llama_dir), kv_transfer_config=config)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_block_file_that_fails_to_load_fails_its_request_only(tiny_llama_dir, tmp_path,
                                                                 policy):
    producer = _engine(tiny_llama_dir, tmp_path, "kv_producer")
    try:
        expected, _ = _run(producer)
    finally:
        producer.llm_engine.shutdown()
    # Corrupt the third prompt's blocks (the only ones not shared with the first two).
    consumer = _engine(tiny_llama_dir, tmp_path, "kv_consumer", enable_prefix_caching=False,
                       kv_load_failure_policy=policy)
    try:
        scheduler = consumer.llm_engine.engine_core.engine_core.scheduler
        hashes = scheduler.kv_cache_manager.block_hashes  # per request, from its tokens
        from pagedllm.request import Request, RequestData

        probe = Request("probe", RequestData(PROMPTS[2], PARAMS))
        for block_hash in hashes(probe)[:2]:
            with open(tmp_path / f"{block_hash.hex()}.safetensors", "wb") as broken:
                broken.write(b"not a tensor file")
        outputs = consumer.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS,
                                    use_tqdm=False)
        if policy == "fail":
            assert [o.outputs[0].finish_reason for o in outputs] == [
                "length", "length", "error"]
            assert [list(o.outputs[0].token_ids) for o in outputs[:2]] == expected[:2]
        else:  # the third computes its prompt itself: the same tokens
            assert [list(o.outputs[0].token_ids) for o in outputs] == expected
            assert outputs[2].num_cached_tokens == 0
        manager = scheduler.kv_cache_manager
        assert manager.get_num_free_blocks() == manager.num_usable_blocks  # nothing leaked
        # The engine serves on.
        again, _ = _run(consumer, PROMPTS[:1])
        assert again == expected[:1]
    finally:
        consumer.llm_engine.shutdown()


def test_blocks_computed_over_a_failed_load_are_not_stored(tiny_llama_dir, tmp_path):
    producer = _engine(tiny_llama_dir, tmp_path, "kv_producer")
    try:
        _run(producer, PROMPTS[:1])  # blocks 0 and 1 of the shared prefix
    finally:
        producer.llm_engine.shutdown()
    longer = SHARED[:32] + list(range(60, 80))  # 52 tokens: its block 2 is new
    engine = _engine(tiny_llama_dir, tmp_path, "kv_both", enable_prefix_caching=False)
    try:
        from pagedllm.request import Request, RequestData

        hashes = engine.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager \
            .block_hashes(Request("probe", RequestData(longer, PARAMS)))
        with open(tmp_path / f"{hashes[0].hex()}.safetensors", "wb") as broken:
            broken.write(b"not a tensor file")
        out = engine.generate({"prompt_token_ids": longer}, PARAMS, use_tqdm=False)[0]
        assert out.outputs[0].finish_reason == "error"
        # Its block 2 was computed over garbage: it must not reach the folder.
        assert not (tmp_path / f"{hashes[2].hex()}.safetensors").exists()
    finally:
        engine.llm_engine.shutdown()
