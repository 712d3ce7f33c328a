"""The engine core in its own process: wire format, identical outputs, abort, faults, cleanup."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from pagedllm import SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.engine.core_client import AsyncMPClient
from pagedllm.engine.exceptions import EngineDeadError, EngineStartupError
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    UtilityRequest,
)
from pagedllm.engine.serial import (
    CoreOutputsDecoder,
    CoreOutputsEncoder,
    CoreRequestDecoder,
    CoreRequestEncoder,
)
from pagedllm.metrics.stats import SchedulerStats
from pagedllm.request import FinishReason, RequestData
from pagedllm.sampling_params import RequestOutputKind
from pagedllm.worker.outputs import LogprobsLists

PROMPTS = [f"Paged attention stores block {i}" for i in range(6)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def _args(model: Path, **kwargs) -> EngineArgs:
    kwargs.setdefault("num_gpu_blocks_override", 128)
    kwargs.setdefault("max_model_len", 256)
    return EngineArgs(model=str(model), **kwargs)


def _greedy(max_tokens: int = 12, kind=RequestOutputKind.FINAL_ONLY, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens,
                          output_kind=kind, **kwargs)


def test_wire_round_trip_is_exact():
    params = SamplingParams(temperature=0.0, stop=["ab", "xyz"], seed=3, logit_bias={5: 1.5},
                            output_kind=RequestOutputKind.DELTA, bad_words=["q"], logprobs=2)
    params.bad_words_token_ids = [[1, 2]]  # an init=False field
    request = EngineCoreRequest(
        "r", RequestData([1, 2, 3], params, 7), arrival_time=12.5, priority=2
    )
    kind, decoded = CoreRequestDecoder().decode(
        CoreRequestEncoder().encode(EngineCoreRequestType.ADD, request))
    assert kind is EngineCoreRequestType.ADD and decoded == request
    assert decoded.data.sampling_params.output_kind is RequestOutputKind.DELTA
    assert decoded.data.sampling_params.output_text_buffer_length == 2
    assert decoded.data.sampling_params.bad_words_token_ids == [[1, 2]]
    for kind, payload in ((EngineCoreRequestType.ABORT, ["a", "b"]),
                          (EngineCoreRequestType.UTILITY, UtilityRequest(4, "reset_prefix_cache"))):
        assert CoreRequestDecoder().decode(CoreRequestEncoder().encode(kind, payload)) == (
            kind, payload)
    outputs = EngineCoreOutputs(
        outputs=[EngineCoreOutput("r", [4, 5], FinishReason.LENGTH, stop_reason="x",
                                  new_logprobs=LogprobsLists([[4, 1]], [[-0.5, -1.0]], [1]))],
        scheduler_stats=SchedulerStats(num_running_reqs=1, kv_cache_usage=0.25))
    decoded_outputs = CoreOutputsDecoder().decode(CoreOutputsEncoder().encode(outputs))
    assert decoded_outputs == outputs
    assert decoded_outputs.outputs[0].finish_reason is FinishReason.LENGTH


def test_sync_mp_client_matches_in_process(tiny_llama_dir):
    def run(multiprocessing: bool) -> list[list[int]]:
        engine = LLMEngine.from_engine_args(_args(tiny_llama_dir), multiprocessing)
        try:
            for i, prompt in enumerate(PROMPTS):
                engine.add_request(str(i), prompt, _greedy())
            done = {}
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        done[output.request_id] = output.outputs[0].token_ids
            if multiprocessing:
                assert engine.engine_core.reset_prefix_cache() is True
            return [done[str(i)] for i in range(len(PROMPTS))]
        finally:
            engine.shutdown()

    assert run(True) == run(False)


@pytest.fixture(scope="module")
def mp_engine(tiny_llama_dir: Path):
    engine = AsyncLLM.from_engine_args(_args(tiny_llama_dir), log_stats=False,
                                       multiprocessing=True)
    yield engine
    engine.shutdown()


def test_abort_crosses_the_process_boundary(mp_engine):
    async def run() -> None:
        stream = mp_engine.generate("hello", _greedy(200, RequestOutputKind.DELTA), "long")
        await stream.__anext__()
        assert mp_engine.engine_core.latest_scheduler_stats.kv_cache_usage > 0
        await mp_engine.abort("long")
        async for _ in stream:
            pass
        for _ in range(50):
            await asyncio.sleep(0.05)
            stats = mp_engine.engine_core.latest_scheduler_stats
            if stats.kv_cache_usage == 0 and stats.num_running_reqs == 0:
                return
        raise AssertionError(f"blocks still held: {stats}")

    asyncio.run(run())


def test_killed_core_fails_streams_fast_and_leaves_nothing(tiny_llama_dir):
    engine = AsyncLLM.from_engine_args(
        _args(tiny_llama_dir, max_model_len=1024, num_gpu_blocks_override=256), log_stats=False,
        multiprocessing=True)
    client = engine.engine_core
    assert isinstance(client, AsyncMPClient)
    socket_dir = client._core._dir
    started: list[str] = []

    async def consume(i: int) -> None:
        async for _ in engine.generate(f"p{i}", _greedy(1000, RequestOutputKind.DELTA),
                                       f"r{i}"):
            started.append(f"r{i}")

    async def run() -> float:
        tasks = [asyncio.create_task(consume(i)) for i in range(3)]
        while len(set(started)) < 3:
            await asyncio.sleep(0.005)
        killed_at = time.monotonic()
        os.kill(client.pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert all(isinstance(r, EngineDeadError) for r in results), results
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate("after", _greedy(), "after"):
                pass
        return time.monotonic() - killed_at

    try:
        assert asyncio.run(run()) < 1.0
        assert engine.errored
    finally:
        engine.shutdown()
    assert not os.path.exists(socket_dir)


def test_shutdown_leaves_no_process_and_no_sockets(tiny_llama_dir):
    engine = AsyncLLM.from_engine_args(_args(tiny_llama_dir), log_stats=False,
                                       multiprocessing=True)
    pid, socket_dir = engine.engine_core.pid, engine.engine_core._core._dir
    assert _alive(pid) and os.path.isdir(socket_dir)
    engine.check_health()
    engine.shutdown()
    assert not _alive(pid) and not os.path.exists(socket_dir)
    with pytest.raises(EngineDeadError):
        engine.check_health()


def test_core_startup_error_surfaces_fast(tiny_llama_dir):
    start = time.monotonic()
    # 4 blocks of 16 tokens cannot hold one 256-token request: the child refuses to start.
    with pytest.raises(EngineStartupError, match="max_model_len"):
        AsyncMPClient(_args(tiny_llama_dir, num_gpu_blocks_override=4).create_engine_config())
    assert time.monotonic() - start < 30
