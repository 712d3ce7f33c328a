"""Disaggregated prefill against two ordinary instances: decode streams' inter-token
latency while long prompts arrive, and the long prompts' time to first token.

Two configurations on the same two cores, the same requests, one after the other:
- disaggregated: a prefill instance (core 0, kv_producer) and a decode instance (core 1,
  kv_consumer), the decode side pulling each prompt's blocks from the prefill side over
  TCP (`--connector tcp`: TcpConnector, vLLM's NixlConnector style; the default) or both
  sharing a folder of KV blocks (`--connector shared-storage`: SharedStorageConnector),
  behind the `disagg-proxy`;
- two ordinary instances (core 0 and core 1) behind a round-robin.
Each instance runs with one thread (`taskset` and PAGEDLLM_NUM_THREADS=1). `--streams`
decode streams (short prompts, `--stream-tokens` tokens, streamed) start together; while
they run, `--long-prompts` prompts of `--long-len` tokens arrive as a Poisson process
(`--rate` per second), each asking `--long-tokens` tokens. Reported: the streams' ITL p50 /
p99 (gaps between their SSE chunks) and the long prompts' TTFT p50 / p99, per
configuration, and the ratios. The transfer's cost: the decode instance's
`vllm:kv_transfer_seconds` per 1k tokens loaded.

    python benchmarks/disagg.py --output-json /tmp/disagg.json
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    load_average,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompt,
    new_parser,
    stop_process,
    wait_until_ready,
    write_json,
)

SRC = Path(__file__).resolve().parents[1] / "src"
SERVE_ARGS: list[str] = []  # --serve-args: flags every instance gets


def start_instance(model: str, core: int, port: int, extra: list[str], log: Path
                   ) -> subprocess.Popen:
    """`pagedllm serve` pinned to one core with one thread."""
    env = {**os.environ, "PAGEDLLM_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    command = ["taskset", "-c", str(core), sys.executable, "-m", "pagedllm.entrypoints.cli",
               "serve", model, "--port", str(port), "--uvicorn-log-level", "warning",
               "--max-model-len", "4096", *SERVE_ARGS, *extra]
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


async def stream_request(client: Any, url: str, body: dict[str, Any]
                         ) -> tuple[list[float], int, str]:
    """Arrival times of a streamed completion's token chunks, its cached tokens and its
    text."""
    times, cached, text = [], 0, ""
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", url, json=stream_body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                times.append(time.perf_counter())
                text += chunk["choices"][0].get("text") or ""
            elif chunk.get("usage"):
                details = chunk["usage"].get("prompt_tokens_details") or {}
                cached = int(details.get("cached_tokens") or 0)
    return times, cached, text


async def run_load(route: Any, streams: list[list[int]], longs: list[list[int]],
                   args: Any) -> dict[str, Any]:
    """The workload through `route(kind, index) -> URL`."""
    import httpx

    rng = random.Random(args.seed)
    async with httpx.AsyncClient(timeout=None) as client:
        async def one_stream(index: int, prompt: list[int]) -> tuple[list[float], int, str]:
            body = {"prompt": prompt, "max_tokens": args.stream_tokens, "temperature": 0,
                    "ignore_eos": True}
            return await stream_request(client, route("stream", index), body)

        async def one_long(index: int, prompt: list[int], delay: float
                           ) -> tuple[float, int, str]:
            await asyncio.sleep(args.first_long_s + delay)
            start = time.perf_counter()
            body = {"prompt": prompt, "max_tokens": args.long_tokens, "temperature": 0,
                    "ignore_eos": True}
            times, cached, text = await stream_request(client, route("long", index), body)
            return times[0] - start, cached, text

        delays, clock = [], 0.0
        for _ in longs:
            clock += rng.expovariate(args.rate)
            delays.append(clock)
        stream_tasks = [one_stream(i, p) for i, p in enumerate(streams)]
        long_tasks = [one_long(i, p, d) for i, (p, d) in enumerate(zip(longs, delays,
                                                                      strict=True))]
        results = await asyncio.gather(*stream_tasks, *long_tasks)
    stream_results = results[: len(streams)]
    long_results = results[len(streams):]
    gaps = [b - a for times, _, _ in stream_results
            for a, b in zip(times, times[1:], strict=False)]
    # Gaps while a long prompt was being prefilled somewhere: the ones disaggregation is for.
    return {"itl": _stats([g * 1000 for g in gaps]),
            "gaps_over_250ms": sum(g > 0.25 for g in gaps), "num_gaps": len(gaps),
            "ttft": _stats([t * 1000 for t, _, _ in long_results]),
            "cached_tokens": sum(r[1] for r in stream_results) + sum(r[1] for r in long_results),
            "stream_seconds": max(times[-1] for times, _, _ in stream_results)
            - min(times[0] for times, _, _ in stream_results),
            "texts": [r[2] for r in stream_results] + [r[2] for r in long_results]}


def _stats(values: list[float]) -> dict[str, float]:
    """p50, p99 and mean (ms)."""
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    return {"p50": at(0.5), "p99": at(0.99), "p999": at(0.999),
            "max": ordered[-1] if ordered else float("nan"),
            "mean": sum(ordered) / len(ordered) if ordered else float("nan"),
            "count": float(len(ordered))}


def _percentile(values: dict[str, float], name: str) -> float:
    return float(values.get(name, float("nan")))


def disaggregated(model: str, streams: list[list[int]], longs: list[list[int]], args: Any,
                  workdir: Path) -> dict[str, Any]:
    """Prefill + decode instances behind the proxy."""
    import httpx
    import uvicorn

    from pagedllm.entrypoints.disagg_proxy import build_app

    def config(role: str) -> str:
        if args.connector == "tcp":
            return json.dumps({"kv_connector": "TcpConnector", "kv_role": role,
                               "kv_port": args.port + 10})
        return json.dumps({"kv_connector": "SharedStorageConnector", "kv_role": role,
                           "kv_connector_extra_config": {
                               "shared_storage_path": str(workdir / "kv")}})

    prefill = start_instance(model, 0, args.port, ["--kv-transfer-config",
                                                   config("kv_producer")], workdir / "p.log")
    decode = start_instance(model, 1, args.port + 1, ["--kv-transfer-config",
                                                      config("kv_consumer")], workdir / "d.log")
    urls = [f"http://127.0.0.1:{args.port}", f"http://127.0.0.1:{args.port + 1}"]
    server = uvicorn.Server(uvicorn.Config(build_app(urls[:1], urls[1:]), host="127.0.0.1",
                                           port=args.port + 2, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    try:
        for process, url in ((prefill, urls[0]), (decode, urls[1])):
            wait_until_ready(process, url + "/health", "an instance", 600)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        proxy = f"http://127.0.0.1:{args.port + 2}/v1/completions"
        result = asyncio.run(run_load(lambda kind, index: proxy, streams, longs, args))
        metrics = httpx.get(urls[1] + "/metrics").text
        result["transfer"] = _transfer_cost(metrics, result["cached_tokens"])
        return result
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        stop_process(prefill, 30)
        stop_process(decode, 30)


def round_robin(model: str, streams: list[list[int]], longs: list[list[int]], args: Any,
                workdir: Path) -> dict[str, Any]:
    """Two ordinary instances, requests alternating between them."""
    processes = [start_instance(model, core, args.port + core, [], workdir / f"rr{core}.log")
                 for core in (0, 1)]
    urls = [f"http://127.0.0.1:{args.port + core}" for core in (0, 1)]
    try:
        for process, url in zip(processes, urls, strict=True):
            wait_until_ready(process, url + "/health", "an instance", 600)
        counter = iter(range(10**9))
        return asyncio.run(run_load(
            lambda kind, index: urls[next(counter) % 2] + "/v1/completions",
            streams, longs, args))
    finally:
        for process in processes:
            stop_process(process, 30)


def _transfer_cost(metrics: str, tokens_loaded: int) -> dict[str, float]:
    """Seconds of loading per 1k tokens loaded (the decode instance's transfer time over
    the cached tokens its answers report)."""
    seconds = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("vllm:kv_transfer_seconds_sum"))
    per_1k = 1000 * seconds / (tokens_loaded / 1000) if tokens_loaded else float("nan")
    return {"load_seconds": seconds, "tokens_loaded": float(tokens_loaded),
            "ms_per_1k_tokens": per_1k}


def main() -> None:
    """Both configurations, then the comparison."""
    parser = new_parser(__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-len", type=int, default=64)
    parser.add_argument("--stream-tokens", type=int, default=768,
                        help="Long enough to outlast the long prompts' arrivals.")
    parser.add_argument("--long-prompts", type=int, default=6)
    parser.add_argument("--long-len", type=int, default=2048)
    parser.add_argument("--long-tokens", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.5, help="Long prompts per second.")
    parser.add_argument("--first-long-s", type=float, default=2.0,
                        help="When the first long prompt may arrive (the streams decode).")
    parser.add_argument("--connector", choices=["tcp", "shared-storage"], default="tcp")
    parser.add_argument("--serve-args", default="",
                        help="Flags for every instance, e.g. '--max-num-batched-tokens 256' "
                             "(prefill in smaller chunks, between decode steps).")
    parser.add_argument("--port", type=int, default=18100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    SERVE_ARGS.extend(args.serve_args.split())
    location = locate_model(args.model)
    tokenizer = load_tokenizer(location)
    rng = random.Random(args.seed)
    streams = [make_prompt(tokenizer, args.stream_len, rng) for _ in range(args.streams)]
    longs = [make_prompt(tokenizer, args.long_len, rng) for _ in range(args.long_prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        disagg = disaggregated(location.path, streams, longs, args, workdir)
        plain = round_robin(location.path, streams, longs, args, workdir)
    print(f"{args.streams} streams x {args.stream_tokens} tokens, {args.long_prompts} prompts "
          f"of {args.long_len} tokens at {args.rate}/s; 1 core per instance")
    for name, result in (("disaggregated (1 prefill + 1 decode)", disagg),
                         ("two instances, round-robin", plain)):
        print(f"  {name:38s} ITL p50 {_percentile(result['itl'], 'p50'):7.1f} ms  "
              f"p99 {_percentile(result['itl'], 'p99'):7.1f} ms  "
              f"max {_percentile(result['itl'], 'max'):7.1f} ms   long TTFT p50 "
              f"{_percentile(result['ttft'], 'p50'):8.1f} ms  p99 "
              f"{_percentile(result['ttft'], 'p99'):8.1f} ms   gaps > 250 ms: "
              f"{result['gaps_over_250ms']}/{result['num_gaps']}")
    ratio = _percentile(plain["itl"], "p99") / _percentile(disagg["itl"], "p99")
    same = sum(a == b for a, b in zip(disagg["texts"], plain["texts"], strict=True))
    print(f"  greedy answers identical in both configurations: {same}/{len(plain['texts'])}")
    print(f"  ITL p99 ratio (round-robin / disaggregated): {ratio:.2f}x; loading cost "
          f"{disagg['transfer']['ms_per_1k_tokens']:.1f} ms per 1k tokens; load average "
          f"{load_average()}")
    if args.output_json:
        write_json(args.output_json, {"machine": machine_info(), "args": vars(args),
                                      "disaggregated": disagg, "round_robin": plain,
                                      "itl_p99_ratio": ratio, "identical_answers": same})


if __name__ == "__main__":
    main()
