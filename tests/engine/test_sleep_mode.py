"""Sleep mode (vLLM's): an idle engine gives its KV cache (level 1) and its weights
(level 2) back and takes them again on wake_up, after which it generates the same tokens,
on the Python layers and on the C decode stack (rebuilt over the new memory); generating
while asleep, sleeping while requests run, bad levels and tags are ValueErrors."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

PROMPTS = [[5 + i, 17, 23, 9, 41, 7, 3] * 3 for i in range(3)]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _tokens(llm: LLM) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _worker(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.executor.worker


@pytest.mark.parametrize("engine_kwargs", [
    dict(dtype="float32"),
    # bfloat16 W4A8 runs decode steps in the C stack, which holds the caches' addresses.
    dict(dtype="bfloat16", quantization="int4"),
], ids=["python-layers", "c-stack"])
def test_sleep_gives_memory_back_and_wakes_to_the_same_tokens(tiny_llama_dir, engine_kwargs):
    llm = LLM(str(tiny_llama_dir), max_model_len=128, enable_sleep_mode=True,
              kv_cache_memory_bytes=2**22, **engine_kwargs)
    try:
        before = _tokens(llm)
        worker = _worker(llm)
        stack_before = worker.model_runner.decode_step
        assert (stack_before is not None) == ("quantization" in engine_kwargs)
        llm.sleep(level=1)
        assert llm.llm_engine.is_sleeping()
        assert all(c.untyped_storage().nbytes() == 0 for c in worker.kv_caches)
        with pytest.raises(ValueError, match="sleeping"):
            _tokens(llm)
        llm.wake_up()
        assert not llm.llm_engine.is_sleeping()
        assert all(c.untyped_storage().nbytes() > 0 for c in worker.kv_caches)
        if stack_before is not None:  # rebuilt over the new memory
            assert worker.model_runner.decode_step not in (None, stack_before)
        assert _tokens(llm) == before
        # Level 2: the weights go too, and come back in two steps.
        llm.sleep(level=2)
        assert worker.model is None
        llm.wake_up(["weights"])
        assert worker.model is not None and llm.llm_engine.is_sleeping()  # KV still away
        llm.wake_up(["kv_cache"])
        assert not llm.llm_engine.is_sleeping()
        assert _tokens(llm) == before
    finally:
        llm.llm_engine.shutdown()


def test_bad_uses_are_value_errors(tiny_llama_dir):
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128)
    try:
        with pytest.raises(ValueError, match="enable_sleep_mode"):
            plain.sleep()
    finally:
        plain.llm_engine.shutdown()
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, enable_sleep_mode=True)
    try:
        with pytest.raises(ValueError, match="level must be 1 or 2"):
            llm.sleep(level=3)
        assert not llm.llm_engine.is_sleeping()
        llm.sleep()
        with pytest.raises(ValueError, match="tags must be among"):
            llm.wake_up(["gpu"])
        llm.wake_up()
        # A request held in the engine: no sleep until it is done.
        llm.llm_engine.add_request("held", {"prompt_token_ids": PROMPTS[0]}, PARAMS)
        with pytest.raises(ValueError, match="while requests run"):
            llm.sleep()
        llm.llm_engine.abort_request("held")
        llm.sleep()
        llm.wake_up()
        assert len(_tokens(llm)) == len(PROMPTS)
    finally:
        llm.llm_engine.shutdown()
