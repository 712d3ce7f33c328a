"""Prefix caching: N requests sharing a long system prompt, with and without the prefix cache.

Every request is one long common prefix (`--prefix-len` tokens of English-like text, a
"system prompt") followed by its own short question (`--question-len` tokens), and asks for
exactly `--output-len` tokens (greedy, EOS ignored), so both configurations do the same
work on the same token ids. The engine is built twice in one run, with
`enable_prefix_caching=True` and `False`, and the report shows both and their ratios.

How it measures. All N requests are added to an `LLMEngine` at once (time t0), then the
script calls `step()` until every request finished, reading a wall-clock timestamp after
each step. A request's time to first token (TTFT) is the timestamp of the first step that
returned a token for it, minus t0; it includes queueing behind the other requests, which is
exactly what a shared-prefix burst costs. Throughput is output (and total) tokens divided
by the time from t0 to the last step. One pass measures both, so TTFT and throughput come
from the same schedule. The prefix cache is reset before each timed pass (a cold start: the
first request computes the prefix, the others reuse it, even within the same step), after
an untimed warm-up on unrelated prompts. The engine's scheduler stats give the prefix-cache
hit rate and the prompt tokens the model actually computed.

    python benchmarks/prefix_caching.py                         # 32 requests, 1000-token prefix
    python benchmarks/prefix_caching.py --num-requests 64 --output-json results/prefix.json
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from typing import Any

from common import (
    format_stat,
    load_average,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompt,
    new_parser,
    prompts_summary,
    run_engine_pass,
    summarize,
    write_json,
)

WARMUP_PROMPT_LEN = 32
WARMUP_OUTPUT_LEN = 4


def make_shared_prefix_prompts(tokenizer: Any, args: argparse.Namespace) -> list[list[int]]:
    """`num_requests` prompts: one shared prefix + a different question each (seeded)."""
    rng = random.Random(args.seed)
    prefix = make_prompt(tokenizer, args.prefix_len, rng)
    return [
        prefix + make_prompt(tokenizer, args.question_len, rng) for _ in range(args.num_requests)
    ]


def timed_pass(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """Add every prompt at t0, step to the end; return TTFTs, throughput and outputs."""
    run = run_engine_pass(engine, prompts, output_len)
    elapsed = run.end - run.start
    ttfts = run.ttfts
    num_output = sum(len(t) for t in run.token_ids.values())
    num_prompt = sum(len(p) for p in prompts)
    return {
        "elapsed_s": elapsed,
        "num_steps": len(run.steps),
        "ttft_s": ttfts,
        "ttft_mean_s": statistics.fmean(ttfts),
        "ttft_median_s": statistics.median(ttfts),
        "ttft_max_s": max(ttfts),
        "output_tokens": num_output,
        "output_tokens_per_s": num_output / elapsed,
        "total_tokens_per_s": (num_prompt + num_output) / elapsed,
        "token_ids": [run.token_ids[str(i)] for i in range(len(prompts))],
    }


def cold_pass(core: Any, engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """Reset the prefix cache, run one timed pass, add the scheduler's counters for it."""
    assert core.reset_prefix_cache(), "blocks still in use after a pass"
    before = core.scheduler.make_stats()
    run = timed_pass(engine, prompts, output_len)
    after = core.scheduler.make_stats()
    for key, name in (
        ("prefix_cache_queries", "prefix_cache_queries"),
        ("prefix_cache_hits", "prefix_cache_hits"),
        ("computed_prompt_tokens", "num_computed_prompt_tokens"),
        ("num_preemptions", "num_preemptions"),
    ):
        run[key] = getattr(after, name) - getattr(before, name)
    return run


def measure(
    enable_prefix_caching: bool, prompts: list[list[int]], args: argparse.Namespace
) -> dict[str, Any]:
    """Build an engine, warm it up, run `num_iters` cold-cache passes; summarize them."""
    from pagedllm import LLM

    label = f"prefix caching {'on' if enable_prefix_caching else 'off'}"
    kwargs = {
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    start = time.perf_counter()
    llm = LLM(
        args.model,
        dtype=args.dtype,
        seed=args.seed,
        enable_prefix_caching=enable_prefix_caching,
        **kwargs,
    )
    setup_s = time.perf_counter() - start
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    rng = random.Random(args.seed + 1)
    warmup = [[rng.randrange(100, 1000) for _ in range(WARMUP_PROMPT_LEN)] for _ in range(2)]
    timed_pass(engine, warmup, WARMUP_OUTPUT_LEN)
    runs = []
    for i in range(args.num_iters):
        run = cold_pass(core, engine, prompts, args.output_len)
        runs.append(run)
        print(
            f"  {label}: iter {i + 1}/{args.num_iters} {run['elapsed_s']:.2f} s, "
            f"TTFT mean {run['ttft_mean_s']:.2f} s, {run['output_tokens_per_s']:.1f} output tok/s, "
            f"{run['computed_prompt_tokens']} prompt tokens computed",
            flush=True,
        )
    del llm, engine, core
    gc.collect()
    metrics = (
        "ttft_mean_s",
        "ttft_median_s",
        "ttft_max_s",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "elapsed_s",
    )
    return {
        "system": label,
        "setup_s": setup_s,
        "summary": {m: summarize([r[m] for r in runs]) for m in metrics},
        "iterations": [{k: v for k, v in r.items() if k != "token_ids"} for r in runs],
        "token_ids": runs[-1]["token_ids"],
    }


def print_report(on: dict[str, Any], off: dict[str, Any]) -> dict[str, float]:
    """A table of both configurations, then the on/off ratios; returns the ratios."""
    columns = [
        ("TTFT mean s", "ttft_mean_s", 2),
        ("TTFT median s", "ttft_median_s", 2),
        ("TTFT max s", "ttft_max_s", 2),
        ("output tok/s", "output_tokens_per_s", 1),
        ("total tok/s", "total_tokens_per_s", 1),
        ("elapsed s", "elapsed_s", 2),
    ]
    header = f"{'system':<20}" + "".join(f"{title:>18}" for title, _, _ in columns)
    print("\n" + header + "\n" + "-" * len(header))
    for result in (on, off):
        cells = [format_stat(result["summary"][key], digits) for _, key, digits in columns]
        print(f"{result['system']:<20}" + "".join(f"{cell:>18}" for cell in cells))
    for result in (on, off):
        last = result["iterations"][-1]
        rate = last["prefix_cache_hits"] / max(last["prefix_cache_queries"], 1)
        print(
            f"{result['system']}: prompt tokens computed {last['computed_prompt_tokens']}, "
            f"prefix hit rate {rate:.1%}, preemptions {last['num_preemptions']}"
        )

    def median(result: dict[str, Any], key: str) -> float:
        return result["summary"][key]["median"]

    ratios = {
        "ttft_mean_speedup": median(off, "ttft_mean_s") / median(on, "ttft_mean_s"),
        "output_tokens_per_s_ratio": (
            median(on, "output_tokens_per_s") / median(off, "output_tokens_per_s")
        ),
        "total_tokens_per_s_ratio": (
            median(on, "total_tokens_per_s") / median(off, "total_tokens_per_s")
        ),
    }
    print(
        f"ratio on/off: TTFT {ratios['ttft_mean_speedup']:.2f}x faster (mean), "
        f"throughput {ratios['output_tokens_per_s_ratio']:.2f}x output tok/s, "
        f"{ratios['total_tokens_per_s_ratio']:.2f}x total tok/s"
    )
    return ratios


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    p = new_parser(__doc__)
    p.add_argument("--model", default=None, help="model path (default: the engine's default)")
    p.add_argument("--num-requests", type=int, default=32, help="requests sharing the prefix")
    p.add_argument("--prefix-len", type=int, default=1000, help="shared prefix, tokens")
    p.add_argument("--question-len", type=int, default=20, help="per-request question, tokens")
    p.add_argument("--output-len", type=int, default=32, help="tokens generated per request")
    p.add_argument("--num-iters", type=int, default=1, help="timed passes per configuration")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and the engine")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="engine dtype",
    )
    p.add_argument("--max-num-seqs", type=int, default=None, help="engine max_num_seqs")
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="engine token budget per step"
    )
    p.add_argument("--output-json", default=None, metavar="PATH", help="write results here")
    return p


def main(argv: list[str] | None = None) -> None:
    """Build the prompts, measure both configurations, print the report, write the JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("num_requests", "prefix_len", "question_len", "output_len", "num_iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    location = locate_model(args.model)
    args.model = location.path
    machine = machine_info()
    prompts = make_shared_prefix_prompts(load_tokenizer(location), args)
    print(f"model {location.path}")
    print(
        f"{args.num_requests} requests: {args.prefix_len}-token shared prefix + "
        f"{args.question_len}-token question, {args.output_len} output tokens each"
    )
    on = measure(True, prompts, args)
    off = measure(False, prompts, args)
    ratios = print_report(on, off)
    identical = on.pop("token_ids") == off.pop("token_ids")
    print(f"greedy outputs identical with and without prefix caching: {identical}")
    if args.output_json:
        machine["loadavg_end"] = load_average()
        write_json(
            args.output_json,
            {
                "benchmark": "prefix_caching",
                "config": vars(args),
                "machine": machine,
                "prompts": prompts_summary(prompts),
                "results": [on, off],
                "ratios": ratios,
                "outputs_identical": identical,
            },
        )
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
