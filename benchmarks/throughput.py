"""Offline throughput: how fast pagedllm (and peers) finish a fixed batch of requests.

In the spirit of vLLM's benchmark_throughput. N prompts of seeded random lengths (English-like
text cut to exact token counts) each ask for exactly `--output-len` tokens with EOS ignored,
so every system does the same work on the same token ids. Reported: requests/s, output
tokens/s, total (prompt + output) tokens/s and elapsed seconds, as the median of
`--num-iters` runs with the min-max range. `--compare hf,llamacpp` also runs transformers'
batched `generate` and llama.cpp (llama-cpp-python on the same GGUF file: multi-sequence
batches through the low-level API, flash attention on and off, and the high-level `Llama`
API one prompt at a time) on the same prompts in the same process, one system after another,
and prints pagedllm's ratio to each configuration, to each peer's best and to the best peer.

    python benchmarks/throughput.py                       # pagedllm only
    python benchmarks/throughput.py --compare hf          # and transformers, bf16 batch 32
    python benchmarks/throughput.py --compare hf,llamacpp --hf-dtype bfloat16,float32 \
        --hf-batch-size 16,32,64 --num-iters 3 --output-json benchmarks/results/throughput.json
    python benchmarks/throughput.py --skip-engine --compare llamacpp --llamacpp-batch-size 16,64
    python benchmarks/throughput.py --device cuda --compare hf --hf-batch-size 64,256
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
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
    summarize,
    write_json,
)
from llamacpp_peer import (
    BatchedDecoder,
    LlamaCppModel,
    LlamaCppSettings,
    SequentialLlama,
    Wave,
    add_llamacpp_args,
    context_per_sequence,
    import_llama_cpp,
    llama_cpp_system_info,
    llama_cpp_version,
    require_gguf,
    settings_from_args,
)

ENGINE = "pagedllm"
WARMUP_PROMPTS = 4
WARMUP_OUTPUT_LEN = 8
METRICS = ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "elapsed_s")


@dataclass
class RunResult:
    """One timed pass over all prompts.

    Attributes:
        elapsed_s: wall time of the generation calls (model loading excluded).
        num_requests: prompts completed.
        prompt_tokens: prompt tokens processed (padding excluded).
        output_tokens: tokens actually generated.
        details: system-specific extras (per-batch times, padding).
    """

    elapsed_s: float
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    details: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Throughputs of this pass."""
        return {
            "requests_per_s": self.num_requests / self.elapsed_s,
            "output_tokens_per_s": self.output_tokens / self.elapsed_s,
            "total_tokens_per_s": (self.prompt_tokens + self.output_tokens) / self.elapsed_s,
            "elapsed_s": self.elapsed_s,
        }


class Runner(Protocol):
    """A system under test, already loaded. `run` may be called many times.

    Attributes:
        peer: which system ("pagedllm", "hf", "llamacpp"); `label` names the configuration.
    """

    peer: str
    label: str
    config: dict[str, Any]
    setup_s: float

    def run(self, prompts: list[list[int]], output_len: int) -> RunResult:
        """Generate exactly `output_len` tokens for every prompt; return the timing."""
        ...


class EngineRunner:
    """pagedllm's offline `LLM.generate` with every request in one call."""

    def __init__(self, location: ModelLocation, args: argparse.Namespace) -> None:
        try:
            from pagedllm import LLM, SamplingParams
        except ImportError as error:
            message = f"pagedllm engine unavailable ({error}); use --skip-engine."
            raise SystemExit(message) from error
        self._sampling_params_cls = SamplingParams
        limits = {
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "quantization": args.quantization,
            "kv_cache_dtype": args.kv_cache_dtype,
            "num_scheduler_steps": args.num_scheduler_steps,
        }
        kwargs = {k: v for k, v in limits.items() if v is not None}
        kwargs["keep_dense_weights"] = args.keep_dense_weights
        kwargs["device"] = args.device
        self.config = {"model": location.path, "dtype": args.dtype, "seed": args.seed, **kwargs}
        self.peer = ENGINE
        self.label = f"pagedllm (dtype={args.dtype}" + (
            f", {args.quantization}{'+dense' if args.keep_dense_weights else ''})"
            if args.quantization
            else ")"
        ) + (f" kv={args.kv_cache_dtype}" if args.kv_cache_dtype else "") + (
            f" steps={args.num_scheduler_steps}" if args.num_scheduler_steps else "")
        start = time.perf_counter()
        self.llm = LLM(model=location.path, dtype=args.dtype, seed=args.seed, **kwargs)
        self.setup_s = time.perf_counter() - start

    def run(self, prompts: list[list[int]], output_len: int) -> RunResult:
        # Greedy, as on the transformers side (see HFRunner._generate).
        params = self._sampling_params_cls(
            temperature=0.0, ignore_eos=True, max_tokens=output_len
        )
        inputs = [{"prompt_token_ids": ids} for ids in prompts]
        # Repeated passes use the same prompts: without a reset, later passes would reuse
        # the first pass's KV (prefix caching) and skip most prefill work.
        self.llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        mismatched = sum(
            out.prompt_token_ids != ids for out, ids in zip(outputs, prompts, strict=True)
        )
        return RunResult(
            elapsed_s=elapsed,
            num_requests=len(outputs),
            prompt_tokens=sum(len(out.prompt_token_ids) for out in outputs),
            output_tokens=sum(len(out.outputs[0].token_ids) for out in outputs),
            details={"prompts_changed_by_engine": mismatched},
        )


class HFRunner:
    """transformers' batched greedy `generate`, EOS suppressed so each row yields output_len."""

    def __init__(self, model: Any, dtype: str, batch_size: int, sort: bool, setup_s: float) -> None:
        self.model = model
        self.batch_size = batch_size
        self.sort = sort
        self.setup_s = setup_s
        self.pad_id = pad_token_id(model)
        self.eos_ids = _eos_token_ids(model)
        order = "sorted" if sort else "unsorted"
        self.peer = "hf"
        self.label = f"hf ({dtype}, bs={batch_size}, {order})"
        self.config = {"dtype": dtype, "batch_size": batch_size, "sort": sort}

    def run(self, prompts: list[list[int]], output_len: int) -> RunResult:
        batch_times, generated, padding = [], 0, 0
        start = time.perf_counter()
        for batch in self._batches(prompts):
            t0 = time.perf_counter()
            num_new, num_pad = self._generate(batch, output_len)
            batch_times.append(time.perf_counter() - t0)
            generated += num_new
            padding += num_pad
        elapsed = time.perf_counter() - start
        return RunResult(
            elapsed_s=elapsed,
            num_requests=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            output_tokens=generated,
            details={"batch_times_s": batch_times, "prompt_padding_tokens": padding},
        )

    def _batches(self, prompts: list[list[int]]) -> Iterator[list[list[int]]]:
        ordered = sorted(prompts, key=len) if self.sort else prompts
        for i in range(0, len(ordered), self.batch_size):
            yield ordered[i : i + self.batch_size]

    def _generate(self, batch: list[list[int]], output_len: int) -> tuple[int, int]:
        """Run one left-padded batch; return (tokens generated, padding tokens)."""
        import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        input_ids = input_ids.to(self.model.device)
        attention_mask = attention_mask.to(self.model.device)
        # min_new_tokens == max_new_tokens masks EOS at every step (the MinNewTokens logits
        # processor), which is how transformers spells vLLM's ignore_eos. Greedy, as on the
        # engine side: the cheapest decoding for both, so the comparison is of the engines.
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            pad_token_id=self.pad_id,
        )
        new_tokens = out[:, width:]
        return self._count_generated(new_tokens), width * len(batch) - sum(map(len, batch))

    def _count_generated(self, new_tokens: Any) -> int:
        """Tokens each row really generated: up to and including its first EOS, if any."""
        total = 0
        for row in new_tokens.tolist():
            ends = [i for i, tok in enumerate(row) if tok in self.eos_ids]
            total += ends[0] + 1 if ends else len(row)
        return total


def _eos_token_ids(model: Any) -> set[int]:
    """Every id that would end a sequence in the model's generation config."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list) else [eos])}


def hf_runners(location: ModelLocation, args: argparse.Namespace) -> Iterator[HFRunner]:
    """One runner per (dtype, batch size); each dtype's model is loaded once, then freed."""
    for dtype in args.hf_dtype:
        model, setup_s = load_hf_model(location, dtype)
        model.to(args.device if args.device != "auto" else "cpu")
        for batch_size in args.hf_batch_size:
            yield HFRunner(model, dtype, batch_size, args.hf_sort, setup_s)
        del model
        gc.collect()


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python: a BatchedDecoder or a SequentialLlama."""

    def __init__(
        self,
        generator: BatchedDecoder | SequentialLlama,
        label: str,
        config: dict[str, Any],
        setup_s: float,
    ) -> None:
        self.generator = generator
        self.peer = "llamacpp"
        self.label = label
        self.config = config
        self.setup_s = setup_s

    def run(self, prompts: list[list[int]], output_len: int) -> RunResult:
        start = time.perf_counter()
        waves = self.generator.generate(prompts, output_len)
        elapsed = time.perf_counter() - start
        return RunResult(
            elapsed_s=elapsed,
            num_requests=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            output_tokens=sum(len(t) for w in waves for t in w.tokens),
            details=_wave_details(waves),
        )

    def close(self) -> None:
        """Free llama.cpp's context (and, for the high-level API, its model)."""
        self.generator.close()


def _wave_details(waves: list[Wave]) -> dict[str, Any]:
    """Where a llama.cpp pass spent its time: prompt evaluation vs decoding."""
    return {
        "num_waves": len(waves),
        "prefill_s": sum(w.first_token_at - w.start for w in waves),
        "decode_s": sum(w.end - w.first_token_at for w in waves),
    }


def llamacpp_runners(location: ModelLocation, args: argparse.Namespace) -> Iterator[Runner]:
    """llama.cpp's configurations: batched (per batch size and flash-attn), then sequential.

    The batched configurations share one loaded model; each gets its own context, freed
    before the next is made, so one KV cache is in memory at a time.
    """
    settings = settings_from_args(args)
    n_ctx_seq = context_per_sequence(args.input_len_max, args.output_len)
    flash = [value == "on" for value in args.llamacpp_flash_attn]
    if "batched" in args.llamacpp_modes:
        yield from _batched_runners(location, settings, flash, n_ctx_seq, args)
    if "sequential" in args.llamacpp_modes:
        for fa in flash:
            start = time.perf_counter()
            generator = SequentialLlama(location.path, settings, fa, n_ctx_seq)
            config = _llamacpp_config(settings, "sequential", fa, 1, n_ctx_seq)
            runner = LlamaCppRunner(
                generator, _llamacpp_label("sequential", fa), config, time.perf_counter() - start
            )
            try:
                yield runner
            finally:
                runner.close()


def _batched_runners(
    location: ModelLocation,
    settings: LlamaCppSettings,
    flash: list[bool],
    n_ctx_seq: int,
    args: argparse.Namespace,
) -> Iterator[Runner]:
    """One runner per (batch size, flash-attn) on a model loaded once."""
    start = time.perf_counter()
    model = LlamaCppModel(location.path)
    load_s = time.perf_counter() - start
    try:
        for batch_size in args.llamacpp_batch_size:
            for fa in flash:
                start = time.perf_counter()
                generator = BatchedDecoder(model, settings, fa, batch_size, n_ctx_seq)
                setup_s = load_s + time.perf_counter() - start
                config = _llamacpp_config(settings, "batched", fa, batch_size, n_ctx_seq)
                label = _llamacpp_label("batched", fa, batch_size, settings.kv_unified)
                runner = LlamaCppRunner(generator, label, config, setup_s)
                try:
                    yield runner
                finally:
                    runner.close()  # the context goes before the next one (or the model)
    finally:
        model.close()


def _llamacpp_label(
    mode: str, flash_attn: bool, batch_size: int | None = None, kv_unified: bool = False
) -> str:
    """`llamacpp (batched, bs=64, fa=on)` or `llamacpp (sequential, fa=off)`."""
    size = f", bs={batch_size}" if batch_size is not None else ""
    unified = ", kv=unified" if kv_unified else ""
    return f"llamacpp ({mode}{size}, fa={'on' if flash_attn else 'off'}{unified})"


def _llamacpp_config(
    settings: LlamaCppSettings, mode: str, flash_attn: bool, batch_size: int, n_ctx_seq: int
) -> dict[str, Any]:
    """Everything that defines a llama.cpp configuration, for the JSON."""
    return {
        "mode": mode,
        "flash_attn": flash_attn,
        "batch_size": batch_size,
        "n_ctx_per_sequence": n_ctx_seq,
        "llama_cpp_python_version": llama_cpp_version(),
        "llama_cpp_system_info": llama_cpp_system_info(),
        **vars(settings),
    }


def measure(runner: Runner, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, time `num_iters` passes, and summarize them."""
    if args.warmup:
        runner.run(prompts[:WARMUP_PROMPTS], WARMUP_OUTPUT_LEN)
    runs = []
    for i in range(args.num_iters):
        result = runner.run(prompts, args.output_len)
        runs.append(result)
        print(
            f"  {runner.label}: iter {i + 1}/{args.num_iters} {result.elapsed_s:.2f} s, "
            f"{result.metrics()['output_tokens_per_s']:.1f} output tok/s",
            flush=True,
        )
        _warn_on_short_output(runner.label, result, len(prompts) * args.output_len)
    per_run = [r.metrics() for r in runs]
    return {
        "system": runner.label,
        "peer": runner.peer,
        "config": runner.config,
        "setup_s": runner.setup_s,
        "summary": {m: summarize([p[m] for p in per_run]) for m in METRICS},
        "iterations": [{**asdict(r), **r.metrics()} for r in runs],
    }


def _warn_on_short_output(label: str, result: RunResult, expected: int) -> None:
    """Say so when a system generated a different number of tokens than asked for."""
    if result.output_tokens != expected:
        print(
            f"  WARNING: {label} generated {result.output_tokens} tokens, expected {expected}.",
            file=sys.stderr,
        )


def systems(location: ModelLocation, args: argparse.Namespace) -> Iterator[Runner]:
    """The systems to measure, built lazily so only one model is in memory at a time."""
    if not args.skip_engine:
        yield EngineRunner(location, args)
    factories: dict[str, Callable[[ModelLocation, argparse.Namespace], Iterator[Runner]]] = {
        "hf": hf_runners,
        "llamacpp": llamacpp_runners,
    }
    for peer in args.compare:
        yield from factories[peer](location, args)


def run_all(
    location: ModelLocation, prompts: list[list[int]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Measure every system in turn; return their result records."""
    results = []
    for runner in systems(location, args):
        print(f"[{runner.label}] loaded in {runner.setup_s:.1f} s", flush=True)
        results.append(measure(runner, prompts, args))
        # A runner's memory (a model, a KV cache) is freed when the generator that made it
        # resumes; dropping our reference first lets that happen before the next one loads.
        del runner
        gc.collect()
    return results


def _median(result: dict[str, Any], metric: str) -> float:
    return float(result["summary"][metric]["median"])


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pagedllm's median tok/s over each peer configuration's, each peer's best, the best.

    Rows have `scope` "config", "peer_best" (the peer's configuration with the highest
    median output tok/s) or "best_peer" (the best configuration of any peer).
    """
    engine = [r for r in results if r["peer"] == ENGINE]
    others = [r for r in results if r["peer"] != ENGINE]
    if not engine or not others:
        return []
    ours = engine[0]

    def row(scope: str, peer: str, theirs: dict[str, Any]) -> dict[str, Any]:
        return {
            "scope": scope,
            "peer": peer,
            "numerator": ours["system"],
            "denominator": theirs["system"],
            **{
                f"{metric}_ratio": _median(ours, metric) / _median(theirs, metric)
                for metric in ("output_tokens_per_s", "total_tokens_per_s")
            },
        }

    def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return max(rows, key=lambda r: _median(r, "output_tokens_per_s"))

    rows = [row("config", r["peer"], r) for r in others]
    for peer in dict.fromkeys(r["peer"] for r in others):
        rows.append(row("peer_best", peer, best([r for r in others if r["peer"] == peer])))
    winner = best(others)
    rows.append(row("best_peer", winner["peer"], winner))
    return rows


def print_report(results: list[dict[str, Any]], ratio_rows: list[dict[str, Any]]) -> None:
    """A table of medians [min-max], then the ratio lines."""
    columns = [
        ("requests/s", "requests_per_s", 3),
        ("output tok/s", "output_tokens_per_s", 1),
        ("total tok/s", "total_tokens_per_s", 1),
        ("elapsed s", "elapsed_s", 2),
    ]
    width = max([30, *(len(r["system"]) for r in results)])
    header = f"{'system':<{width}}" + "".join(f" {title:>23}" for title, _, _ in columns)
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        cells = [format_stat(r["summary"][key], digits) for _, key, digits in columns]
        print(f"{r['system']:<{width}}" + "".join(f" {cell:>23}" for cell in cells))
    titles = {
        "config": "ratio {numerator} / {denominator}",
        "peer_best": "ratio {numerator} / {peer}'s best, {denominator}",
        "best_peer": "ratio {numerator} / the best peer, {denominator}",
    }
    for i, row in enumerate(ratio_rows):
        if row["scope"] != "config" and (i == 0 or ratio_rows[i - 1]["scope"] == "config"):
            print()  # a blank line between the per-config ratios and the best-of ratios
        print(
            titles[row["scope"]].format(**row) + ": "
            f"{row['output_tokens_per_s_ratio']:.2f}x output tok/s "
            f"({row['total_tokens_per_s_ratio']:.2f}x total tok/s)"
        )


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    p = new_parser(__doc__)
    _add_workload_args(p)
    _add_engine_args(p.add_argument_group("pagedllm engine"))
    _add_peer_args(p.add_argument_group("peers"))
    return p


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    """What is run and how it is timed and recorded."""
    add = p.add_argument
    add_model_arg(p)
    add("--num-prompts", type=int, default=64, help="number of requests")
    add("--input-len-min", type=int, default=100, help="shortest prompt, tokens")
    add("--input-len-max", type=int, default=300, help="longest prompt, tokens")
    add("--output-len", type=int, default=128, help="tokens per request (EOS ignored)")
    add("--seed", type=int, default=0, help="seed of the prompts and the engine")
    add(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the engine and transformers run (the same device for both)",
    )
    add(
        "--num-iters",
        type=int,
        default=1,
        help="timed repetitions; the median and min-max are reported",
    )
    add(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"an untimed warm-up run ({WARMUP_PROMPTS} prompts, {WARMUP_OUTPUT_LEN} tokens) "
        "before timing each system",
    )
    add(
        "--output-json",
        default=None,
        metavar="PATH",
        help="write config, machine info, raw timings and summaries here",
    )


def _add_engine_args(group: argparse._ArgumentGroup) -> None:
    """pagedllm's own knobs."""
    add = group.add_argument
    add(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="engine weights and activations dtype",
    )
    add_scheduler_steps_arg(group)
    add_weight_args(group)
    add(
        "--max-num-seqs",
        type=int,
        default=None,
        help="most requests per engine step (None: the engine's default)",
    )
    add(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget per engine step (None: the engine's default)",
    )
    add(
        "--skip-engine",
        action="store_true",
        help="do not run pagedllm; measure only the --compare peers",
    )


def _add_peer_args(group: argparse._ArgumentGroup) -> None:
    """Which peers run on the same prompts, and their settings."""
    add = group.add_argument
    add_compare_args(group, "comma list of peers run on the same prompts")
    add(
        "--hf-batch-size",
        type=positive_int_list,
        default=[32],
        help="comma list of transformers generate batch sizes",
    )
    add(
        "--hf-sort",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="sort prompts by length before batching (less padding)",
    )
    add_llamacpp_args(group, offline=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the options."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.skip_engine and not args.compare:
        parser.error("--skip-engine needs --compare: there would be nothing to run.")
    for name in ("num_prompts", "num_iters", "output_len", "input_len_min"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    if args.input_len_max < args.input_len_min:
        parser.error("--input-len-max must be at least --input-len-min.")
    if "llamacpp" in args.compare:
        # Fail now, with the install command, rather than after the other systems ran.
        most = import_llama_cpp().llama_max_parallel_sequences()
        if max(args.llamacpp_batch_size) > most:
            parser.error(f"--llamacpp-batch-size: llama.cpp runs at most {most} sequences.")
        settings_from_args(args)
    return args


def main(argv: list[str] | None = None) -> None:
    """Build the prompts, measure every system, print the table, write the JSON."""
    args = parse_args(argv)
    location = locate_model(args.model)
    if "llamacpp" in args.compare:
        require_gguf(location.gguf_file)
    machine = machine_info()
    tokenizer = load_tokenizer(location)
    prompts = make_prompts(
        tokenizer, args.num_prompts, args.input_len_min, args.input_len_max, args.seed
    )
    summary = prompts_summary(prompts)
    print(f"model {location.path}")
    print(
        f"{summary['num_prompts']} prompts, {summary['total_prompt_tokens']} prompt tokens "
        f"({summary['min_len']}-{summary['max_len']}), {args.output_len} output tokens each"
    )
    results = run_all(location, prompts, args)
    ratio_rows = ratios(results)
    print_report(results, ratio_rows)
    # Peak resident memory of this process: pagedllm's own when it runs without --compare.
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak_rss_mb:.0f} MB")
    if args.output_json:
        machine["loadavg_end"] = load_average()
        machine["peak_rss_mb"] = peak_rss_mb
        config = {**vars(args), "model_path": location.path}
        write_json(
            args.output_json,
            {
                "benchmark": "throughput",
                "config": config,
                "machine": machine,
                "prompts": summary,
                "results": results,
                "ratios": ratio_rows,
            },
        )
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
