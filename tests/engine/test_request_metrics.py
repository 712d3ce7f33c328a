"""Per-request numbers as vLLM gives them: `RequestOutput.num_cached_tokens` (prefix-cache
hits when first scheduled) and `RequestOutput.metrics` (arrival, first scheduled, first
token, last token, finished), offline and streamed."""

from __future__ import annotations

import asyncio

from pagedllm import LLM, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.sampling_params import RequestOutputKind

PROMPT = {"prompt_token_ids": list(range(5, 45))}  # 40 tokens: two full 16-token blocks


def _check_order(metrics) -> None:
    assert metrics.arrival_time <= metrics.first_scheduled_time <= metrics.first_token_time
    assert metrics.first_token_time <= metrics.last_token_time <= metrics.finished_time
    assert metrics.time_in_queue == metrics.first_scheduled_time - metrics.arrival_time


def test_cached_tokens_and_timings_offline(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_gpu_blocks_override=128)
    params = SamplingParams(temperature=0.7, seed=1, max_tokens=4, n=2)
    first, = llm.generate([PROMPT], params, use_tqdm=False)
    again, = llm.generate([PROMPT], params, use_tqdm=False)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 32  # the two full blocks the first one left cached
    for output in (first, again):
        _check_order(output.metrics)
    assert again.metrics.arrival_time > first.metrics.finished_time


def test_streamed_outputs_carry_the_numbers_so_far(tiny_llama_dir):
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), num_gpu_blocks_override=128))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)

    async def run() -> list:
        return [o async for o in engine.generate(PROMPT, params, "s0")]

    try:
        outputs = asyncio.run(run())
    finally:
        engine.shutdown()
    assert all(o.num_cached_tokens == 0 for o in outputs)
    assert outputs[0].metrics.finished_time is None
    assert outputs[0].metrics.first_token_time == outputs[0].metrics.last_token_time
    assert outputs[-1].finished
    _check_order(outputs[-1].metrics)
    assert outputs[-1].metrics.last_token_time >= outputs[0].metrics.last_token_time
