"""`pagedllm bench throughput` and `pagedllm bench latency`: the engine in-process.

throughput: `--num-prompts` random prompts of `--input-len` tokens, each generating
`--output-len` tokens (ignore_eos), submitted at once; prints requests/s, total tokens/s and
output tokens/s as vLLM's `bench throughput` does. latency: one batch of `--batch-size`
such prompts, timed end to end `--num-iters` times after `--num-iters-warmup` untimed runs;
prints the mean and percentiles. Both show progress bars (tqdm).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from pagedllm.bench.prompts import random_token_prompts
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.entrypoints.llm import LLM
from pagedllm.sampling_params import SamplingParams

PERCENTILES = (10, 25, 50, 75, 90, 99)


def add_workload_args(parser: argparse.ArgumentParser, latency: bool) -> None:
    """The workload flags (vLLM's names) of throughput or latency."""
    parser.add_argument("--input-len", type=int, default=32 if latency else 128,
                        help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=128, help="tokens generated per "
                        "request (EOS ignored)")
    parser.add_argument("--n", type=int, default=1, help="sequences per prompt")
    parser.add_argument("--seed-prompts", type=int, default=0, help="seed of the prompts")
    parser.add_argument("--output-json", default=None, help="also write the results here")
    if latency:
        parser.add_argument("--batch-size", type=int, default=8)
        parser.add_argument("--num-iters-warmup", type=int, default=3)
        parser.add_argument("--num-iters", type=int, default=10)
    else:
        parser.add_argument("--num-prompts", type=int, default=256)
        parser.add_argument("--random-range-ratio", type=float, default=0.0,
                            help="prompt lengths vary by this share around --input-len")


def _engine(args: argparse.Namespace) -> LLM:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineArgs)
              if getattr(args, f.name, None) is not None}
    return LLM(**values)


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(n=args.n, temperature=1.0 if args.n > 1 else 0.0, top_p=1.0,
                          max_tokens=args.output_len, ignore_eos=True, seed=0)


def _prompts(llm: LLM, num: int, args: argparse.Namespace, ratio: float = 0.0
             ) -> list[dict[str, Any]]:
    vocab = len(llm.get_tokenizer())
    ids = random_token_prompts(num, args.input_len, vocab, args.seed_prompts, ratio)
    return [{"prompt_token_ids": p} for p in ids]


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Generate for every prompt at once; requests/s and tokens/s of the whole run."""
    llm = _engine(args)
    prompts = _prompts(llm, args.num_prompts, args, args.random_range_ratio)
    params = _params(args)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    result = {
        "elapsed_time": elapsed, "num_requests": len(prompts),
        "total_num_tokens": prompt_tokens + output_tokens, "output_tokens": output_tokens,
        "requests_per_second": len(prompts) / elapsed,
        "tokens_per_second": (prompt_tokens + output_tokens) / elapsed,
        "output_tokens_per_second": output_tokens / elapsed,
    }
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, "
          f"{result['tokens_per_second']:.2f} total tokens/s, "
          f"{result['output_tokens_per_second']:.2f} output tokens/s")
    _write(args, result)
    return result


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    """Time one batch end to end, several times."""
    llm = _engine(args)
    prompts = _prompts(llm, args.batch_size, args)
    params = _params(args)

    def once() -> float:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    for _ in tqdm(range(args.num_iters_warmup), desc="Warmup iterations"):
        once()
    latencies = [once() for _ in tqdm(range(args.num_iters), desc="Profiling iterations")]
    values = np.array(latencies)
    percentiles = {str(p): float(np.percentile(values, p)) for p in PERCENTILES}
    result = {"avg_latency": float(values.mean()), "latencies": latencies,
              "percentiles": percentiles}
    print(f"Avg latency: {result['avg_latency']:.4f} seconds")
    for p in PERCENTILES:
        print(f"{p}% percentile latency: {percentiles[str(p)]:.4f} seconds")
    _write(args, result)
    return result


def _write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
