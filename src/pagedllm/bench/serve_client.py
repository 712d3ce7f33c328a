"""The streaming client of `pagedllm bench serve` and benchmarks/serving.py: sends requests
at a rate and concurrency, and measures per request the time to first token (TTFT), the
inter-token latencies (ITL), time per output token (TPOT) and end-to-end latency.

It runs on aiohttp, as vLLM's benchmark client does: the client shares the machine with the
server it measures, and httpx's streaming (pure-Python HTTP parsing per chunk) took 4.25 s
of CPU for 128 requests x 64 streamed tokens against the server's 0.8 s and the engine's
22 s on 2 cores (BENCHMARKS.md)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class RequestResult:
    """What one request measured (times in seconds). Token counts come from the server's
    usage when it sends one (stream_options.include_usage), else stay 0."""

    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_text: str = ""
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


async def send_request(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                       headers: dict[str, str]) -> RequestResult:
    """Stream one completion; TTFT and ITL are taken at each chunk carrying text."""
    result = RequestResult()
    start = last = time.perf_counter()
    try:
        async with session.post(url, json=payload, headers=headers) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.read())[:200]!r}"
                return result
            async for raw in response.content:  # one server-sent event line at a time
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                    result.output_tokens = chunk["usage"].get("completion_tokens", 0)
                text = "".join(c.get("text") or "" for c in chunk.get("choices", []))
                if not text:
                    continue
                now = time.perf_counter()
                if not result.output_text:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                result.output_text += text
        result.latency = time.perf_counter() - start
        result.success = bool(result.output_text)
        result.error = "" if result.success else "empty output"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as error:
        result.error = repr(error)
    return result


async def run_workload(
    url: str, payloads: list[dict[str, Any]], *, request_rate: float = float("inf"),
    max_concurrency: int | None = None, api_key: str | None = None, seed: int = 0,
    request_timeout: float = 600.0, on_done: Callable[[RequestResult], None] | None = None,
) -> tuple[list[RequestResult], float]:
    """Send every payload to `url`, started as a Poisson process of `request_rate` per
    second (all at once when infinite), at most `max_concurrency` in flight; returns the
    results in payload order and the duration in seconds."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency or len(payloads) or 1)
    rng = random.Random(seed)
    # A connection per request (as vLLM's benchmark, a session per request): llama-server
    # closes a kept-alive connection after a few requests, and reusing a closed one failed
    # a quarter of its requests ("Can not write request body").
    connector = aiohttp.TCPConnector(limit=len(payloads) + 4, force_close=True)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    # read_bufsize: a streamed line longer than the default 64 KiB buffer would fail.
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     read_bufsize=2**20) as session:

        async def one(payload: dict[str, Any]) -> RequestResult:
            async with limit:
                result = await send_request(session, url, payload, headers)
            if on_done is not None:
                on_done(result)
            return result

        start = time.perf_counter()
        tasks = []
        for payload in payloads:
            tasks.append(asyncio.create_task(one(payload)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def _stats(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(v * scale for v in values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean": statistics.fmean(ordered), "median": statistics.median(ordered), "p99": p99}


def summarize_run(results: list[RequestResult], duration: float,
                  tokenizer: Any | None = None) -> dict[str, Any]:
    """Aggregate metrics. Output tokens: the server's usage, else `tokenizer` re-encoding
    each output text (for servers that send no usage)."""
    done = [r for r in results if r.success]
    for r in done:
        if not r.output_tokens and tokenizer is not None:
            r.output_tokens = len(tokenizer.encode(r.output_text, add_special_tokens=False))
    total_out = sum(r.output_tokens for r in done)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.success})[:5],
        "duration_s": duration,
        "total_input_tokens": sum(r.prompt_tokens for r in done),
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration if duration else 0.0,
        "output_throughput": total_out / duration if duration else 0.0,
        "ttft_ms": _stats([r.ttft for r in done]),
        "tpot_ms": _stats(tpots),
        "itl_ms": _stats([x for r in done for x in r.itl]),
        "e2el_ms": _stats([r.latency for r in done]),
    }


def print_summary(name: str, summary: dict[str, Any]) -> None:
    """vLLM-style block of one run."""
    print(f"{'=' * 18} Serving Benchmark Result: {name} {'=' * 18}")
    print(f"{'Successful requests:':<40}{summary['completed']:<10}")
    print(f"{'Failed requests:':<40}{summary['failed']:<10}")
    print(f"{'Benchmark duration (s):':<40}{summary['duration_s']:<10.2f}")
    print(f"{'Total input tokens:':<40}{summary['total_input_tokens']:<10}")
    print(f"{'Total generated tokens:':<40}{summary['total_output_tokens']:<10}")
    print(f"{'Request throughput (req/s):':<40}{summary['request_throughput']:<10.2f}")
    print(f"{'Output token throughput (tok/s):':<40}{summary['output_throughput']:<10.2f}")
    for key, label in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token"),
                       ("itl_ms", "Inter-token Latency"), ("e2el_ms", "End-to-end Latency")):
        stats = summary[key]
        print(f"{'-' * 14}{label}{'-' * 14}")
        for stat in ("mean", "median", "p99"):
            print(f"{f'{stat.capitalize()} {key[:-3].upper()} (ms):':<40}{stats[stat]:<10.2f}")
    for error in summary["errors"]:
        print(f"error: {error}")
