"""The `pagedllm bench` subcommands: throughput, latency (in-process) and serve (a server)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

BENCHMARKS = ("throughput", "latency", "serve")


def add_bench_parser(subparsers: Any,
                     add_engine_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """`pagedllm bench {throughput,latency,serve}`; `add_engine_args` adds the EngineArgs
    flags (as `pagedllm serve` has them) to the in-process benchmarks."""
    from pagedllm.bench.offline import add_workload_args
    from pagedllm.bench.serve import add_serve_args

    bench = subparsers.add_parser("bench", help="Benchmark the engine or a running server.",
                                  description="vLLM's benchmark commands.")
    kinds = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    throughput = kinds.add_parser("throughput", help="Offline throughput: many requests at "
                                  "once through the engine in-process.")
    add_workload_args(throughput, latency=False)
    add_engine_args(throughput)
    latency = kinds.add_parser("latency", help="Latency of one batch, end to end.")
    add_workload_args(latency, latency=True)
    add_engine_args(latency)
    serve = kinds.add_parser("serve", help="Online serving: streaming requests to a running "
                             "OpenAI-compatible server.")
    add_serve_args(serve)


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen benchmark; the exit code."""
    if args.benchmark == "serve":
        from pagedllm.bench.serve import run_serve

        summary = run_serve(args)
        return 0 if summary["completed"] else 1
    from pagedllm.bench.offline import run_latency, run_throughput

    (run_throughput if args.benchmark == "throughput" else run_latency)(args)
    return 0
