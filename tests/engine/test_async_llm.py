"""AsyncLLM with the core in a thread and in a child process: concurrent streams, abort and
cancellation free their KV blocks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM, AsyncLLMEngine
from pagedllm.engine.exceptions import EngineDeadError
from pagedllm.sampling_params import RequestOutputKind

PROMPTS = [f"Paged attention stores block {i}" for i in range(12)]


@pytest.fixture(scope="module", params=[False, True], ids=["thread", "process"])
def engine(tiny_llama_dir: Path, request: pytest.FixtureRequest):
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), num_gpu_blocks_override=256, max_model_len=512),
        multiprocessing=request.param)
    yield engine
    engine.shutdown()


def _params(kind=RequestOutputKind.DELTA, **kwargs) -> SamplingParams:
    kwargs.setdefault("max_tokens", 10)
    return SamplingParams(temperature=0.0, ignore_eos=True, output_kind=kind, **kwargs)


async def _collect(engine: AsyncLLM, prompt: str, request_id: str, **kwargs) -> str:
    text = ""
    async for output in engine.generate(prompt, _params(**kwargs), request_id):
        text += output.outputs[0].text
    return text


def _idle(engine: AsyncLLM) -> None:
    stats = engine.engine_core.latest_scheduler_stats
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
    assert stats.kv_cache_usage == 0
    assert engine.get_num_unfinished_requests() == 0


def test_concurrent_generate_matches_offline(engine, tiny_llama_dir):
    async def run() -> list[str]:
        return await asyncio.gather(
            *(_collect(engine, p, f"c{i}") for i, p in enumerate(PROMPTS)))

    streamed = asyncio.run(run())
    llm = LLM(str(tiny_llama_dir), num_gpu_blocks_override=256, max_model_len=512)
    offline = llm.generate(PROMPTS, _params(RequestOutputKind.FINAL_ONLY), use_tqdm=False)
    assert streamed == [o.outputs[0].text for o in offline]
    _idle(engine)


def test_an_online_engine_takes_one_step_at_a_time_by_default(engine):
    """The offline LLM groups the steps of requests answered whole; an online engine does
    not (a request arriving during a group would wait for it), unless asked."""
    assert engine.engine_config.scheduler_config.num_scheduler_steps == 1


def test_cancelled_caller_is_aborted(engine):
    async def run() -> None:
        async def consume() -> None:
            async for _ in engine.generate("hello", _params(max_tokens=400), "cancel-me"):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        assert engine.engine_core.latest_scheduler_stats.kv_cache_usage > 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.3)

    asyncio.run(run())
    _idle(engine)


def test_abort_ends_the_stream(engine):
    async def run() -> list:
        outputs = []
        async for output in engine.generate("hello", _params(max_tokens=400), "abort-me"):
            outputs.append(output)
            if len(outputs) == 2:
                await engine.abort("abort-me")
        await asyncio.sleep(0.3)
        return outputs

    outputs = asyncio.run(run())
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
    _idle(engine)


def test_early_break_frees_blocks(engine):
    async def run() -> None:
        stream = engine.generate("hello", _params(max_tokens=400), "break-me")
        async for _ in stream:
            break
        await stream.aclose()
        await asyncio.sleep(0.3)

    asyncio.run(run())
    _idle(engine)


def test_bad_input_raises_and_queues_nothing(engine):
    async def run() -> None:
        with pytest.raises(ValueError, match="vocab"):
            async for _ in engine.generate({"prompt_token_ids": [10**6]}, _params(), "bad"):
                pass
        with pytest.raises(ValueError, match="already running"):
            first = engine.generate("x", _params(max_tokens=200), "dup")
            await first.__anext__()
            try:
                async for _ in engine.generate("x", _params(), "dup"):
                    pass
            finally:
                await first.aclose()
        await asyncio.sleep(0.3)

    asyncio.run(run())
    _idle(engine)


def test_alias_health_and_shutdown(tiny_llama_dir):
    assert AsyncLLMEngine is AsyncLLM
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), num_gpu_blocks_override=64, max_model_len=256),
        log_stats=False)
    engine.check_health()
    engine.shutdown()
    assert engine.errored
    with pytest.raises(EngineDeadError):
        engine.check_health()


def test_a_core_crash_fails_waiters_and_health(tiny_llama_dir):
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), num_gpu_blocks_override=64, max_model_len=256),
        log_stats=False)

    def crash():
        raise RuntimeError("boom")

    engine.engine_core.engine_core.step = crash

    async def run() -> None:
        with pytest.raises(EngineDeadError, match="boom"):
            async for _ in engine.generate("hello", _params(), "doomed"):
                pass
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate("hello", _params(), "after"):
                pass

    try:
        asyncio.run(run())
        assert engine.errored
    finally:
        engine.shutdown()


def test_multi_step_streams_in_groups_with_the_same_text(tiny_llama_dir):
    """num_scheduler_steps=4 through the engine core's own process: deltas of up to 4
    tokens, the same text as one step at a time, nothing held afterwards."""
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), num_gpu_blocks_override=256, max_model_len=512,
                   num_scheduler_steps=4),
        multiprocessing=True)

    async def stream(prompt: str, request_id: str) -> list[list[int]]:
        return [list(output.outputs[0].token_ids)
                async for output in engine.generate(prompt, _params(max_tokens=13), request_id)]

    async def run() -> list[list[list[int]]]:
        return await asyncio.gather(*(stream(p, f"m{i}") for i, p in enumerate(PROMPTS[:4])))

    try:
        deltas = asyncio.run(run())
        _idle(engine)
    finally:
        engine.shutdown()
    llm = LLM(str(tiny_llama_dir), num_gpu_blocks_override=256, max_model_len=512)
    offline = llm.generate(PROMPTS[:4], _params(RequestOutputKind.FINAL_ONLY, max_tokens=13),
                           use_tqdm=False)
    for chunks, want in zip(deltas, offline, strict=True):
        assert [t for chunk in chunks for t in chunk] == list(want.outputs[0].token_ids)
        assert max(len(chunk) for chunk in chunks) > 1  # tokens came in groups
        assert max(len(chunk) for chunk in chunks) <= 4
