"""Data parallelism: `data_parallel_size` engine cores behind one AsyncLLM. Greedy float32
outputs equal one engine's, token for token (DP=2, and DP=2 x TP=2 on Qwen2); requests are
spread by load; an abort frees its blocks on its own core; a synchronous engine and a
threaded core refuse DP by name."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.engine.dp_client import DPAsyncMPClient
from pagedllm.metrics.stats import SchedulerStats

PROMPTS = [[5 + i, 17, 23 + i, 9, 41] * (i % 4 + 1) for i in range(10)]
ENGINE = dict(dtype="float32", kv_cache_memory_bytes=2**22, max_num_batched_tokens=16)
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def _one_engine(model_dir) -> list[list[int]]:
    llm = LLM(str(model_dir), **ENGINE)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


async def _tokens(engine: AsyncLLM, index: int, params: SamplingParams = PARAMS) -> list[int]:
    last = None
    async for output in engine.generate({"prompt_token_ids": PROMPTS[index]}, params, f"r{index}"):
        last = output
    assert last is not None
    return list(last.outputs[0].token_ids)


@pytest.mark.parametrize("arch, tp", [("llama", 1), ("qwen2", 2)])
def test_data_parallel_cores_give_one_engines_tokens(arch, tp, request):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    want = _one_engine(model_dir)
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(model_dir), data_parallel_size=2, tensor_parallel_size=tp,
                   **ENGINE),
        multiprocessing=True,
    )
    try:
        client = engine.engine_core
        assert isinstance(client, DPAsyncMPClient) and len(client.cores) == 2

        async def run() -> list[list[int]]:
            return await asyncio.gather(*(_tokens(engine, i) for i in range(len(PROMPTS))))

        assert asyncio.run(run()) == want
        assert client.num_requests_sent == [5, 5]  # all sent at once: alternating
        stats = client.latest_scheduler_stats
        assert stats.num_running_reqs == 0 and stats.kv_cache_usage == 0
        assert stats.num_computed_prompt_tokens == sum(len(p) for p in PROMPTS)
    finally:
        engine.shutdown()


def test_abort_frees_blocks_on_its_core(tiny_llama_dir):
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), data_parallel_size=2, **ENGINE),
        multiprocessing=True,
    )
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)

    async def run() -> None:
        streams = [asyncio.ensure_future(_tokens(engine, i, long)) for i in range(2)]
        await asyncio.sleep(1.0)
        for index, stream in enumerate(streams):
            await engine.abort(f"r{index}")
            stream.cancel()
        for _ in range(100):  # the cores report their freed blocks
            await asyncio.sleep(0.05)
            stats = engine.engine_core.latest_scheduler_stats
            if stats.num_running_reqs == 0 and stats.kv_cache_usage == 0:
                return
        raise AssertionError(f"blocks still held: {stats}")

    try:
        asyncio.run(run())
        assert engine.engine_core.num_requests_sent == [1, 1]
    finally:
        engine.shutdown()


def test_requests_go_to_the_least_loaded_core():
    client = DPAsyncMPClient.__new__(DPAsyncMPClient)
    sent: list[list[str]] = [[], [], []]
    client.cores = [SimpleNamespace(add_request=lambda r, i=i: sent[i].append(r.request_id))
                    for i in range(3)]
    client._owner, client._num_assigned = {}, [0, 0, 0]
    client.num_requests_sent = [0, 0, 0]
    # Core 0: two waiting (weigh 8); core 1: idle but a fuller cache; core 2: idle.
    client._stats = [SchedulerStats(num_waiting_reqs=2), SchedulerStats(kv_cache_usage=0.5),
                     SchedulerStats(kv_cache_usage=0.1)]
    for index in range(4):
        client.add_request(SimpleNamespace(request_id=f"r{index}"))
    assert sent == [[], ["r1", "r3"], ["r0", "r2"]]
    client.abort_requests = DPAsyncMPClient.abort_requests.__get__(client)
    client.cores[1].abort_requests = lambda ids: None
    client.abort_requests(["r1", "r3"])
    assert client._num_assigned == [0, 0, 2] and "r1" not in client._owner


def test_data_parallel_needs_the_async_multiprocess_engine(tiny_llama_dir):
    with pytest.raises(ValueError, match="data_parallel_size=2: data-parallel engine cores"):
        LLM(str(tiny_llama_dir), data_parallel_size=2)
    with pytest.raises(ValueError, match="data_parallel_size=2 runs each engine core"):
        AsyncLLM.from_engine_args(
            EngineArgs(model=str(tiny_llama_dir), data_parallel_size=2), multiprocessing=False)
