"""Many clients at once share the batch; a client that leaves has its request aborted."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai

from .conftest import API_KEY, MODEL_NAME, metric

LABELS = {"model_name": MODEL_NAME}


def test_32_concurrent_streaming_clients(server):
    prompts = [f"Continuous batching lets request {i} join" for i in range(32)]

    async def run() -> tuple[list, list]:
        async with openai.AsyncOpenAI(base_url=server.url_v1, api_key=API_KEY,
                                      max_retries=0) as client:
            async def streamed(i: int, prompt: str) -> tuple[str, str | None]:
                if i % 2:
                    stream = await client.chat.completions.create(
                        model=MODEL_NAME, messages=[{"role": "user", "content": prompt}],
                        max_tokens=8, temperature=0, stream=True,
                        extra_body={"ignore_eos": True})
                    parts = [c.choices[0] async for c in stream]
                    return "".join(p.delta.content or "" for p in parts), parts[-1].finish_reason
                stream = await client.completions.create(
                    model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0, stream=True,
                    extra_body={"ignore_eos": True})
                parts = [c.choices[0] async for c in stream]
                return "".join(p.text for p in parts), parts[-1].finish_reason

            async def plain(i: int, prompt: str) -> tuple[str, str | None]:
                if i % 2:
                    out = await client.chat.completions.create(
                        model=MODEL_NAME, messages=[{"role": "user", "content": prompt}],
                        max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
                    return out.choices[0].message.content, out.choices[0].finish_reason
                out = await client.completions.create(
                    model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                    extra_body={"ignore_eos": True})
                return out.choices[0].text, out.choices[0].finish_reason

            many = await asyncio.gather(*(streamed(i, p) for i, p in enumerate(prompts)))
            ones = [await plain(i, p) for i, p in enumerate(prompts)]
            return many, ones

    streamed_results, plain_results = asyncio.run(run())
    assert streamed_results == plain_results
    assert all(reason == "length" for _, reason in streamed_results)


def _wait_idle(http: httpx.Client, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = http.get("/metrics").text
        idle = (metric(text, "pagedllm:num_requests_running", **LABELS) == 0
                and metric(text, "pagedllm:kv_cache_usage_perc", **LABELS) == 0)
        if idle or time.monotonic() > deadline:
            assert idle, "requests still running or KV blocks still in use"
            return text
        time.sleep(0.05)


def _aborts(text: str) -> float:
    return metric(text, "pagedllm:request_success_total", finished_reason="abort", **LABELS)


def _own_client(server, **kwargs) -> httpx.Client:
    """A client of its own, so closing it really closes the connection."""
    kwargs.setdefault("timeout", 30)
    return httpx.Client(base_url=server.base_url,
                        headers={"Authorization": f"Bearer {API_KEY}"}, **kwargs)


LONG = {"model": MODEL_NAME, "prompt": "Paged attention", "max_tokens": 1000,
        "temperature": 0, "ignore_eos": True}


def test_stream_disconnect_frees_blocks(server, http):
    before = _wait_idle(http)
    with _own_client(server) as own, own.stream(
        "POST", "/v1/completions", json={**LONG, "stream": True}
    ) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(4)]
        assert any(line.startswith("data:") for line in received)
        during = http.get("/metrics").text
        assert metric(during, "pagedllm:num_requests_running", **LABELS) == 1
        assert metric(during, "pagedllm:kv_cache_usage_perc", **LABELS) > 0
    after = _wait_idle(http)
    assert _aborts(after) - _aborts(before) == 1
    generated = (metric(after, "pagedllm:generation_tokens_total", **LABELS)
                 - metric(before, "pagedllm:generation_tokens_total", **LABELS))
    assert generated < 1000


def test_non_stream_disconnect_frees_blocks(server, http):
    before = _wait_idle(http)
    with _own_client(server, timeout=httpx.Timeout(30, read=0.3)) as own:
        try:
            own.post("/v1/completions", json=LONG)
            raise AssertionError("the request should have outlived the client's patience")
        except httpx.ReadTimeout:
            pass
    after = _wait_idle(http)
    assert _aborts(after) - _aborts(before) == 1


def test_event_loop_serves_while_the_model_runs(server, http):
    with _own_client(server) as own, own.stream(
        "POST", "/v1/completions", json={**LONG, "stream": True}
    ) as response:
        next(line for line in response.iter_lines() if line.startswith("data:"))
        start = time.monotonic()
        for _ in range(5):
            assert http.get("/health").status_code == 200
        assert (time.monotonic() - start) / 5 < 0.5
    _wait_idle(http)
