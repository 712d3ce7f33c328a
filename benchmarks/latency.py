"""Latency: time to first token and decode speed of pagedllm, for one request and small batches.

For each batch size B (`--batch-sizes`, 1,8,32) B requests of exactly `--input-len` prompt
tokens (deterministic English-like text) are added to an `LLMEngine` at once (t0), each asking
for exactly `--output-len` tokens (greedy, EOS ignored); then `step()` is called until all
finish. A request's TTFT is the wall time after the first step that returned a token for it,
minus t0. Decode tokens/s (aggregate over the batch) is the tokens returned by the steps after
the last request got its first token, divided by the time from then to the end of the pass
(for B = 1: (output_len - 1) / (end - first token)); TPOT is that time / (output_len - 1).
Prompt tokens/s is the batch's prompt tokens / the last TTFT (for B = 1: input_len / TTFT).
Prefix caching is off by default so every pass prefills its prompts in full.
Reported: median [min-max] of `--num-iters` passes.

At B = 1 it also prints the fraction of the memory floor reached: the bytes the engine's
decode step reads at the pass's mean context (input_len + output_len / 2; step_bytes.py:
its 4-bit groups with their scales, the LM head a greedy step reads, the KV cache in its
dtype) over the machine's read bandwidth (a 1 GiB float32 sum), against the measured TPOT.

`--compare hf,llamacpp` also measures one request at a time (B = 1) on the same prompts with
transformers (`generate` with max_new_tokens=1 for TTFT, then a full `generate`:
decode tok/s = (output_len - 1) / (total - TTFT)) and llama.cpp (llama-cpp-python's low-level
API on the same GGUF file: the prompt in one llama_decode call, then one call per token,
greedy), and prints pagedllm's B = 1 ratios against each.

    python benchmarks/latency.py
    python benchmarks/latency.py --batch-sizes 1 --num-iters 5 --output-json results/latency.json
    python benchmarks/latency.py --compare hf,llamacpp --num-iters 5 \
        --output-json benchmarks/results/latency.json
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Protocol

from common import (
    ModelLocation,
    add_compare_args,
    add_model_arg,
    add_scheduler_steps_arg,
    add_weight_args,
    format_stat,
    load_average,
    load_hf_model,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompts,
    new_parser,
    pad_token_id,
    positive_int_list,
    prompts_summary,
    run_engine_pass,
    summarize,
    write_json,
)
from llamacpp_peer import (
    BatchedDecoder,
    LlamaCppModel,
    add_llamacpp_args,
    context_per_sequence,
    import_llama_cpp,
    llama_cpp_system_info,
    llama_cpp_version,
    require_gguf,
    settings_from_args,
)
from step_bytes import decode_step_bytes, measure_read_bandwidth

METRICS = (
    "ttft_mean_ms",
    "ttft_max_ms",
    "prompt_tokens_per_s",
    "decode_tokens_per_s",
    "tpot_ms",
    "elapsed_s",
)
PEER_METRICS = ("ttft_ms", "prompt_tokens_per_s", "decode_tokens_per_s", "tpot_ms", "elapsed_s")
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
        # Every prompt is prefilled by the time the last request gets its first token.
        "prompt_tokens_per_s": sum(map(len, prompts)) / max(ttfts),
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else float("nan"),
        "tpot_ms": per_request * 1e3,
        "elapsed_s": run.end - run.start,
        "output_tokens": sum(len(t) for t in run.token_ids.values()),
        "num_steps": len(run.steps),
    }


def warmup_prompts(tokenizer: Any, batch: int, args: argparse.Namespace) -> list[list[int]]:
    """The untimed warm-up pass's prompts (not the timed ones)."""
    return make_prompts(tokenizer, batch, args.input_len, args.input_len, seed=args.seed + 99)


def pass_prompts(tokenizer: Any, batch: int, it: int, args: argparse.Namespace) -> list[list[int]]:
    """Pass `it`'s prompts: fresh each pass (different seeds), the same for every system and
    every run of the script."""
    seed = args.seed + 1000 * batch + it
    return make_prompts(tokenizer, batch, args.input_len, args.input_len, seed=seed)


def measure(engine: Any, tokenizer: Any, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up once (untimed), then `--num-iters` timed passes of `batch` requests."""
    if args.warmup:
        timed_pass(engine, warmup_prompts(tokenizer, batch, args), WARMUP_OUTPUT_LEN)
    iterations = []
    for it in range(args.num_iters):
        prompts = pass_prompts(tokenizer, batch, it, args)
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


class SingleStreamPeer(Protocol):
    """A peer that generates for one prompt at a time, already loaded."""

    peer: str
    label: str
    config: dict[str, Any]
    setup_s: float

    def time_one(self, prompt: list[int], output_len: int) -> tuple[float, float, int]:
        """Generate `output_len` greedy tokens; return (TTFT s, total s, tokens generated)."""
        ...

    def close(self) -> None:
        """Free the peer's model and caches."""
        ...


class HFPeer:
    """transformers' `generate` on one prompt: a 1-token call for TTFT, then a full call."""

    def __init__(self, location: ModelLocation, dtype: str) -> None:
        self.model, self.setup_s = load_hf_model(location, dtype)
        self.pad_id = pad_token_id(self.model)
        self.peer = "hf"
        self.label = f"hf ({dtype})"
        self.config = {"dtype": dtype}

    def time_one(self, prompt: list[int], output_len: int) -> tuple[float, float, int]:
        ttft, _ = self._generate(prompt, 1)
        total, generated = self._generate(prompt, output_len)
        return ttft, total, generated

    def _generate(self, prompt: list[int], new_tokens: int) -> tuple[float, int]:
        """Time one greedy generate of exactly `new_tokens` tokens (EOS masked)."""
        import torch

        input_ids = torch.tensor([prompt])
        start = time.perf_counter()
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # masks EOS: transformers' ignore_eos
            do_sample=False,
            pad_token_id=self.pad_id,
        )
        return time.perf_counter() - start, out.shape[1] - len(prompt)

    def close(self) -> None:
        del self.model
        gc.collect()


class LlamaCppPeer:
    """llama.cpp's low-level API with one sequence: the prompt, then a decode call a token."""

    def __init__(self, location: ModelLocation, args: argparse.Namespace, flash_attn: bool):
        settings = settings_from_args(args)
        n_ctx = context_per_sequence(args.input_len, args.output_len)
        start = time.perf_counter()
        self.model = LlamaCppModel(location.path)
        self.decoder = BatchedDecoder(self.model, settings, flash_attn, 1, n_ctx)
        self.setup_s = time.perf_counter() - start
        self.peer = "llamacpp"
        self.label = f"llamacpp (fa={'on' if flash_attn else 'off'})"
        self.config = {
            "flash_attn": flash_attn,
            "n_ctx": n_ctx,
            "llama_cpp_python_version": llama_cpp_version(),
            "llama_cpp_system_info": llama_cpp_system_info(),
            **vars(settings),
        }

    def time_one(self, prompt: list[int], output_len: int) -> tuple[float, float, int]:
        (wave,) = self.decoder.generate([prompt], output_len)
        generated = len(wave.tokens[0])
        return wave.first_token_at - wave.start, wave.end - wave.start, generated

    def close(self) -> None:
        self.decoder.close()
        self.model.close()


def peers(location: ModelLocation, args: argparse.Namespace) -> Iterator[SingleStreamPeer]:
    """Each --compare peer configuration in turn, loaded lazily and freed after use."""
    makers: dict[str, list[Callable[[], SingleStreamPeer]]] = {
        "hf": [partial(HFPeer, location, dtype) for dtype in args.hf_dtype],
        "llamacpp": [
            partial(LlamaCppPeer, location, args, value == "on")
            for value in args.llamacpp_flash_attn
        ],
    }
    for name in args.compare:
        for make in makers[name]:
            peer = make()
            try:
                yield peer
            finally:
                peer.close()


def peer_pass_metrics(
    prompt: list[int], output_len: int, ttft: float, total: float, generated: int
) -> dict[str, Any]:
    """One single-request pass's figures; decode covers the output_len - 1 tokens after the
    first."""
    decode_s = total - ttft
    return {
        "ttft_ms": ttft * 1e3,
        "prompt_tokens_per_s": len(prompt) / ttft,
        "decode_tokens_per_s": (output_len - 1) / decode_s if decode_s > 0 else float("nan"),
        "tpot_ms": decode_s / max(1, output_len - 1) * 1e3,
        "elapsed_s": total,
        "output_tokens": generated,
        "prompts": prompts_summary([prompt]),
    }


def measure_peer(
    peer: SingleStreamPeer, tokenizer: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Warm up, then `--num-iters` single-request passes on pagedllm's B = 1 prompts."""
    if args.warmup:
        peer.time_one(warmup_prompts(tokenizer, 1, args)[0], WARMUP_OUTPUT_LEN)
    iterations = []
    for it in range(args.num_iters):
        (prompt,) = pass_prompts(tokenizer, 1, it, args)
        ttft, total, generated = peer.time_one(prompt, args.output_len)
        if generated != args.output_len:
            print(f"warning: {peer.label} generated {generated} tokens, expected {args.output_len}")
        run = peer_pass_metrics(prompt, args.output_len, ttft, total, generated)
        iterations.append(run)
        print(
            f"  {peer.label} pass {it + 1}: TTFT {run['ttft_ms']:.1f} ms, "
            f"decode {run['decode_tokens_per_s']:.1f} tok/s"
        )
    return {
        "system": peer.label,
        "peer": peer.peer,
        "config": peer.config,
        "setup_s": peer.setup_s,
        "batch_size": 1,
        "summary": {key: summarize([r[key] for r in iterations]) for key in PEER_METRICS},
        "iterations": iterations,
    }


def measure_peers(
    location: ModelLocation, tokenizer: Any, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every peer configuration, one after another."""
    records = []
    for peer in peers(location, args):
        print(f"[{peer.label}] loaded in {peer.setup_s:.1f} s", flush=True)
        records.append(measure_peer(peer, tokenizer, args))
    return records


def single_stream_ratios(
    results: list[dict[str, Any]], peer_records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """pagedllm's B = 1 medians over each peer's: prompt tok/s, decode tok/s, TTFT."""
    ours = next((r["summary"] for r in results if r["batch_size"] == 1), None)
    if ours is None:
        return []
    return [
        {
            "numerator": "pagedllm (batch 1)",
            "denominator": rec["system"],
            "prompt_tokens_per_s_ratio": ours["prompt_tokens_per_s"]["median"]
            / rec["summary"]["prompt_tokens_per_s"]["median"],
            "decode_tokens_per_s_ratio": ours["decode_tokens_per_s"]["median"]
            / rec["summary"]["decode_tokens_per_s"]["median"],
            # Below 1 means pagedllm answers sooner.
            "ttft_ratio": ours["ttft_mean_ms"]["median"] / rec["summary"]["ttft_ms"]["median"],
        }
        for rec in peer_records
    ]


def print_peers(
    peer_records: list[dict[str, Any]], results: list[dict[str, Any]], ratio_rows: list[dict]
) -> None:
    """A single-stream table (pagedllm's B = 1 row, then each peer), then the ratios."""
    columns = [
        ("TTFT ms", "ttft_ms", 1),
        ("prompt tok/s", "prompt_tokens_per_s", 1),
        ("decode tok/s", "decode_tokens_per_s", 1),
        ("TPOT ms", "tpot_ms", 2),
    ]
    rows = [
        ("pagedllm (batch 1)", {**r["summary"], "ttft_ms": r["summary"]["ttft_mean_ms"]})
        for r in results
        if r["batch_size"] == 1
    ]
    rows += [(rec["system"], rec["summary"]) for rec in peer_records]
    width = max(len(name) for name, _ in rows)
    header = f"{'single stream':<{width}}" + "".join(f" {t:>23}" for t, _, _ in columns)
    print("\n" + header + "\n" + "-" * len(header))
    for name, summary in rows:
        cells = [format_stat(summary[key], digits) for _, key, digits in columns]
        print(f"{name:<{width}}" + "".join(f" {cell:>23}" for cell in cells))
    for row in ratio_rows:
        print(
            f"ratio {row['numerator']} / {row['denominator']}: "
            f"prompt tok/s {row['prompt_tokens_per_s_ratio']:.2f}x, "
            f"decode tok/s {row['decode_tokens_per_s_ratio']:.2f}x, "
            f"TTFT {row['ttft_ratio']:.2f}x (below 1: pagedllm is sooner)"
        )
    if peer_records and not ratio_rows:
        print("no ratios: pagedllm was not measured at batch size 1 (--skip-engine, --batch-sizes)")


def print_report(results: list[dict[str, Any]]) -> None:
    """One row per batch size: medians with [min-max]."""
    columns = [
        ("TTFT mean ms", "ttft_mean_ms", 1),
        ("TTFT max ms", "ttft_max_ms", 1),
        ("prompt tok/s", "prompt_tokens_per_s", 1),
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
    p = new_parser(__doc__)
    add = p.add_argument
    add_model_arg(p)
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
    add_weight_args(p)
    add_scheduler_steps_arg(p)
    add(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="enable the engine's prefix cache (off: every prompt is prefilled in full)",
    )
    add(
        "--max-model-len",
        type=int,
        default=None,
        help="the engine's context limit (default: the model's; lower it for models whose "
        "full context does not fit the KV cache, e.g. Qwen3's 40,960)",
    )
    add("--output-json", default=None, metavar="PATH", help="write config, machine, timings")
    add(
        "--skip-engine",
        action="store_true",
        help="do not run pagedllm; measure only the --compare peers",
    )
    _add_peer_args(p.add_argument_group("peers (one request at a time)"))
    return p


def _add_peer_args(group: argparse._ArgumentGroup) -> None:
    """Which peers run at batch size 1 on pagedllm's B = 1 prompts, and their settings."""
    add_compare_args(group, "comma list of peers measured one request at a time")
    add_llamacpp_args(group, offline=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the options."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("input_len", "output_len", "num_iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    if args.output_len < 2:
        parser.error("--output-len must be at least 2 to measure decode.")
    if args.skip_engine and not args.compare:
        parser.error("--skip-engine needs --compare: there would be nothing to run.")
    if "llamacpp" in args.compare:
        # Fail now, with the install command, rather than after pagedllm ran.
        import_llama_cpp()
        settings_from_args(args)
    return args


def measure_engine(
    location: ModelLocation, tokenizer: Any, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], float]:
    """pagedllm at every batch size; returns the records and the engine's setup time."""
    try:
        from pagedllm import LLM
    except ImportError as error:
        raise SystemExit(f"pagedllm engine unavailable ({error}); use --skip-engine.") from error

    start = time.perf_counter()
    llm = LLM(
        model=location.path,
        dtype=args.dtype,
        seed=args.seed,
        enable_prefix_caching=args.prefix_caching,
        quantization=args.quantization,
        keep_dense_weights=args.keep_dense_weights,
        num_scheduler_steps=args.num_scheduler_steps,
        **({"kv_cache_dtype": args.kv_cache_dtype} if args.kv_cache_dtype else {}),
        **({"max_model_len": args.max_model_len} if args.max_model_len else {}),
    )
    setup_s = time.perf_counter() - start
    print(f"engine ready in {setup_s:.1f} s; {args.input_len} in / {args.output_len} out")
    results = [measure(llm.llm_engine, tokenizer, b, args) for b in args.batch_sizes]
    print_report(results)
    for result in results:
        if result["batch_size"] == 1:
            result["roofline"] = floor_fraction(llm, result, args)
    return results, setup_s


def floor_fraction(llm: Any, result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The batch-1 decode step's memory floor (step_bytes.py) and the fraction of it the
    measured median TPOT reaches; printed."""
    context = args.input_len + args.output_len // 2
    step = decode_step_bytes(llm, context)
    bandwidth = measure_read_bandwidth()
    floor_ms = step["total"] / bandwidth * 1e3
    tpot = result["summary"]["tpot_ms"]["median"]
    print(f"batch-1 decode floor: {step['total'] / 1e6:.1f} MB a step at {context} positions "
          f"(weights {(step['total'] - step['kv']) / 1e6:.1f}, KV {step['kv'] / 1e6:.2f}) / "
          f"{bandwidth / 1e9:.1f} GB/s read = {floor_ms:.2f} ms; measured TPOT {tpot:.2f} ms: "
          f"{floor_ms / tpot:.0%} of the floor")  # fmt: skip
    return {"step_bytes": step, "bandwidth_gb_s": bandwidth / 1e9, "context": context,
            "floor_ms": floor_ms, "tpot_ms": tpot, "fraction": floor_ms / tpot}


def main(argv: list[str] | None = None) -> None:
    """Measure pagedllm at each batch size, then the peers; print the tables, write the JSON."""
    args = parse_args(argv)
    location = locate_model(args.model)
    args.model = location.path
    if "llamacpp" in args.compare:
        require_gguf(location.gguf_file)
    machine = machine_info()
    tokenizer = load_tokenizer(location)
    print(f"model {location.path}")
    results, setup_s = ([], None) if args.skip_engine else measure_engine(location, tokenizer, args)
    # The engine (and its threads' memory) is gone before a peer loads.
    gc.collect()
    peer_records = measure_peers(location, tokenizer, args)
    ratio_rows = single_stream_ratios(results, peer_records)
    if peer_records:
        print_peers(peer_records, results, ratio_rows)
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
                "peers": peer_records,
                "ratios": ratio_rows,
            },
        )
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
