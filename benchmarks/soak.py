"""Soak test of the OpenAI-compatible server: many streaming clients for a long time, with
clients that hang up mid-stream and clients that send bad parameters.

Each of `--clients` asyncio clients loops until `--duration` seconds have passed: it picks a
random prompt length and `max_tokens`, a completion or a chat request, and streams it to the
end; `--disconnect-fraction` of the requests hang up after a few chunks instead, and
`--bad-fraction` send invalid parameters (each must get a 4xx with the OpenAI error JSON).
Pass, as the operator needs it: no 5xx, no hung request (none stalls longer than
`--stall-timeout` or outlives the run by more than it), every KV block free at the end (from
/metrics), and the server's resident memory (API process and engine core together) growing
less than 5% from the end of the warm-up (`--warmup` seconds) to the end of the run.

    python benchmarks/soak.py                       # 256 clients, 10 minutes, default model
    python benchmarks/soak.py --duration 60 --model /path/to/model
    python benchmarks/soak.py --base-url http://127.0.0.1:8000 --server-pid 1234

Without --base-url it starts `pagedllm serve` on a free loopback port (extra flags after
--server-args). The JSON report goes to --output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    default_model_path,
    machine_info,
    new_parser,
    stop_process,
    wait_until_ready,
    write_json,
)

from pagedllm.bench.prompts import WORDS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "soak"
READY_TIMEOUT_S = 600.0
# Invalid requests the server must refuse with a 4xx and the OpenAI error JSON.
BAD_BODIES: list[dict[str, Any]] = [
    {"temperature": -1.0}, {"max_tokens": -5}, {"n": 0}, {"top_p": 1.5}, {"top_k": -7},
    {"stop": [""]}, {"logit_bias": {"not-a-token": 1}}, {"model": "no-such-model"},
    {"prompt": ""}, {"messages": []}, {"max_tokens": 10**9}, {"logprobs": 1000},
    {"presence_penalty": 9.0}, {"seed": "x"}, {"stream_options": {"include_usage": True},
                                                "stream": False},
]


@dataclass
class SoakConfig:
    """What the clients do."""

    clients: int = 256
    duration_s: float = 600.0
    warmup_s: float = 60.0
    disconnect_fraction: float = 0.10
    bad_fraction: float = 0.05
    min_prompt_words: int = 4
    max_prompt_words: int = 160
    max_output_tokens: int = 128
    stall_timeout_s: float = 120.0
    seed: int = 0
    api_key: str | None = None


@dataclass
class SoakReport:
    """What the run measured, and whether it passed."""

    requests: int = 0
    completed: int = 0
    disconnected: int = 0
    bad_sent: int = 0
    bad_refused_4xx: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    hung: int = 0
    generated_tokens: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    running_at_end: float | None = None
    waiting_at_end: float | None = None
    kv_usage_at_end: float | None = None
    rss_after_warmup_mib: float | None = None
    rss_at_end_mib: float | None = None
    rss_growth_pct: float | None = None
    # (seconds, [MiB of the API process, of the engine core, ...]) every 2 s.
    rss_samples_mib: list[tuple[float, list[float]]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every pass condition held."""
        return not self.failures


# ------------------------------------------------------------------------------ clients


class _Clients:
    """The shared state of the client tasks."""

    def __init__(self, base_url: str, config: SoakConfig) -> None:
        self.base_url = base_url
        self.config = config
        self.report = SoakReport()
        self.statuses: Counter[str] = Counter()
        self.ttfts: list[float] = []
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}

    async def run_client(self, client: httpx.AsyncClient, index: int, deadline: float) -> None:
        rng = random.Random(self.config.seed * 100_003 + index)
        while time.monotonic() < deadline:
            roll = rng.random()
            self.report.requests += 1
            try:
                if roll < self.config.bad_fraction:
                    await self._bad(client, rng)
                else:
                    hang_up = roll < self.config.bad_fraction + self.config.disconnect_fraction
                    await self._stream(client, rng, hang_up)
            except httpx.TimeoutException:
                self.report.hung += 1
            except httpx.HTTPError as error:
                self.report.client_errors.append(f"{type(error).__name__}: {error}"[:300])

    def _body(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        words = rng.randint(self.config.min_prompt_words, self.config.max_prompt_words)
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        common = {"model": MODEL_NAME, "max_tokens": rng.randint(1, self.config.max_output_tokens),
                  "temperature": rng.choice([0.0, 0.7, 1.0]), "stream": True,
                  "stream_options": {"include_usage": True}}
        if rng.random() < 0.5:
            return "/v1/completions", {**common, "prompt": text}
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}

    async def _stream(self, client: httpx.AsyncClient, rng: random.Random, hang_up: bool) -> None:
        path, body = self._body(rng)
        chunks_before_hanging_up = rng.randint(1, 4)
        start = time.perf_counter()
        first = True
        async with client.stream("POST", self.base_url + path, json=body,
                                 headers=self.headers) as response:
            self._count(response.status_code, path)
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                self._check_error(response.status_code, text, path, expected_4xx=False)
                return
            chunks = 0
            async for line in _sse_lines(response):
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    self.report.completed += 1
                    return
                event = json.loads(line[6:])
                if "error" in event:
                    self._check_error(event["error"].get("code", 500), line, path, False)
                    return
                if first:
                    self.ttfts.append(time.perf_counter() - start)
                    first = False
                usage = event.get("usage")
                if usage:
                    self.report.generated_tokens += usage.get("completion_tokens", 0)
                chunks += 1
                if hang_up and chunks >= chunks_before_hanging_up:
                    self.report.disconnected += 1
                    return  # leaving the block closes the connection mid-stream
            self.report.client_errors.append(f"{path}: stream ended without [DONE]")

    async def _bad(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        bad = rng.choice(BAD_BODIES)
        path, body = self._body(rng)
        if "prompt" in bad or "messages" in bad:  # a bad prompt goes to its own endpoint
            path = "/v1/completions" if "prompt" in bad else "/v1/chat/completions"
            body.pop("prompt", None)
            body.pop("messages", None)
        body.update(bad)
        self.report.bad_sent += 1
        response = await client.post(self.base_url + path, json=body, headers=self.headers)
        self._count(response.status_code, path)
        self._check_error(response.status_code, response.text, path, expected_4xx=True)

    def _count(self, status: int, path: str) -> None:
        self.statuses[str(status)] += 1

    def _check_error(self, status: int, text: str, path: str, expected_4xx: bool) -> None:
        if status >= 500:
            self.report.server_errors.append(f"{path} -> {status}: {text[:300]}")
            return
        if not 400 <= status < 500:
            if expected_4xx:
                self.report.client_errors.append(f"bad request to {path} got {status}")
            return
        try:
            error = json.loads(text)["error"]
            ok = isinstance(error["message"], str) and error["code"] == status
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            self.report.client_errors.append(f"{path} -> {status} without the error JSON")
        elif expected_4xx:
            self.report.bad_refused_4xx += 1
        else:
            self.report.client_errors.append(f"{path} -> {status}: {text[:200]}")


async def _sse_lines(response: httpx.Response):  # noqa: ANN201 - an async generator
    """The lines of an event stream, split at newlines only: generated text may hold
    characters str.splitlines() also breaks at (U+2028, U+0085...), which JSON carries raw."""
    pending = ""
    async for text in response.aiter_text():
        pending += text
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.rstrip("\r")
    if pending:
        yield pending


# ------------------------------------------------------------------------------- server


def process_tree_rss(pid: int) -> list[float]:
    """Resident memory of a process and of each descendant (the engine core, workers), MiB."""
    import psutil

    root = psutil.Process(pid)
    sizes = []
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            sizes.append(process.memory_info().rss / (1 << 20))
    return sizes


def read_metric(text: str, name: str) -> float | None:
    """The value of the first sample of a Prometheus metric, or None."""
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if match:
            return float(match.group(2))
    return None


async def _sample_rss(pid: int | None, samples: list[tuple[float, list[float]]],
                      start: float, stop: asyncio.Event) -> None:
    while pid is not None and not stop.is_set():
        samples.append((time.monotonic() - start, process_tree_rss(pid)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=2.0)


def _rss_at(samples: list[tuple[float, list[float]]], t_from: float, t_to: float
            ) -> float | None:
    """Median total RSS of the samples taken between t_from and t_to seconds."""
    window = [sum(sizes) for t, sizes in samples if t_from <= t <= t_to]
    return statistics.median(window) if window else None


async def run_soak(base_url: str, config: SoakConfig, server_pid: int | None) -> SoakReport:
    """Drive the server for `config.duration_s` seconds and check what an operator needs."""
    clients = _Clients(base_url, config)
    limits = httpx.Limits(max_connections=config.clients + 8, max_keepalive_connections=0)
    timeout = httpx.Timeout(connect=30.0, read=config.stall_timeout_s, write=30.0, pool=60.0)
    rss_samples: list[tuple[float, list[float]]] = []
    start = time.monotonic()
    deadline = start + config.duration_s
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(server_pid, rss_samples, start, stop))
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        tasks = [asyncio.create_task(clients.run_client(client, i, deadline))
                 for i in range(config.clients)]
        # A request started just before the deadline may run on; past the stall timeout
        # after the deadline a client is counted hung.
        done, pending = await asyncio.wait(tasks, timeout=config.duration_s
                                           + config.stall_timeout_s)
        for task in pending:
            task.cancel()
        clients.report.hung += len(pending)
        for task in done:
            if task.exception() is not None:
                clients.report.client_errors.append(repr(task.exception())[:300])
    stop.set()
    await sampler
    report = clients.report
    report.status_counts = dict(clients.statuses)
    if clients.ttfts:
        ordered = sorted(clients.ttfts)
        report.ttft_p50_s = round(ordered[len(ordered) // 2], 4)
        report.ttft_p99_s = round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 4)
    await _check_end_state(base_url, report)
    report.rss_samples_mib = [(round(t, 1), [round(x, 1) for x in sizes])
                              for t, sizes in rss_samples]
    if server_pid is not None:
        report.rss_after_warmup_mib = _rss_at(rss_samples, config.warmup_s - 6, config.warmup_s)
        # Both under load: the last seconds of the warm-up and of the run.
        report.rss_at_end_mib = _rss_at(rss_samples, config.duration_s - 6, config.duration_s)
        if report.rss_after_warmup_mib and report.rss_at_end_mib:
            growth = report.rss_at_end_mib / report.rss_after_warmup_mib - 1
            report.rss_growth_pct = round(100 * growth, 2)
    _judge(report, config)
    return report


async def _check_end_state(base_url: str, report: SoakReport) -> None:
    """Wait (up to 60 s) for the engine to have nothing running; read the KV usage."""
    async with httpx.AsyncClient(timeout=30) as client:
        deadline = time.monotonic() + 60
        while True:
            text = (await client.get(base_url + "/metrics")).text
            report.running_at_end = read_metric(text, "pagedllm:num_requests_running")
            report.waiting_at_end = read_metric(text, "pagedllm:num_requests_waiting")
            report.kv_usage_at_end = read_metric(text, "pagedllm:kv_cache_usage_perc")
            idle = not report.running_at_end and not report.waiting_at_end
            if (idle and not report.kv_usage_at_end) or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.5)


def _judge(report: SoakReport, config: SoakConfig) -> None:
    if report.server_errors:
        report.failures.append(f"{len(report.server_errors)} responses were 5xx")
    if report.hung:
        report.failures.append(f"{report.hung} requests hung")
    if report.client_errors:
        report.failures.append(f"{len(report.client_errors)} client-side errors")
    if report.kv_usage_at_end != 0 or report.running_at_end or report.waiting_at_end:
        report.failures.append(
            f"not idle at the end: running {report.running_at_end}, waiting "
            f"{report.waiting_at_end}, KV usage {report.kv_usage_at_end}")
    if report.rss_growth_pct is not None and report.rss_growth_pct >= 5.0:
        report.failures.append(f"resident memory grew {report.rss_growth_pct}% after warm-up")
    if report.bad_refused_4xx != report.bad_sent:
        report.failures.append(
            f"{report.bad_sent - report.bad_refused_4xx} bad requests were not refused")
    if not report.completed:
        report.failures.append("no request completed")


def start_server(model: str, extra: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """`pagedllm serve MODEL` on a free loopback port; returns (process, base URL)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    # The whole KV cache resident from the start: otherwise its pages become resident as
    # the block pool cycles through them, which reads as growth but is the budget being
    # reached (1 GiB by default). The memory check is about leaks.
    env.setdefault("PAGEDLLM_CPU_KVCACHE_PREFAULT", "1")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", model, "--host",
             "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_NAME,
             "--uvicorn-log-level", "warning", *extra],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}"
    wait_until_ready(process, base_url + "/health", f"the server (log: {log_path})",
                     READY_TIMEOUT_S)
    return process, base_url


def stop_server(process: subprocess.Popen) -> int:
    """SIGTERM (the server drains), then SIGKILL after 60 s; returns the exit code."""
    return stop_process(process, 60.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = new_parser(__doc__)
    p.add_argument("--model", default=None, help="model to serve (default: the default model)")
    p.add_argument("--base-url", default=None, help="an already running server instead")
    p.add_argument("--server-pid", type=int, default=None,
                   help="its process id, for the memory check (with --base-url)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="seconds after which memory growth is measured")
    p.add_argument("--disconnect-fraction", type=float, default=0.10)
    p.add_argument("--bad-fraction", type=float, default=0.05)
    p.add_argument("--max-prompt-words", type=int, default=160)
    p.add_argument("--max-output-tokens", type=int, default=128)
    p.add_argument("--stall-timeout", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="benchmarks/results/soak.json")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="flags passed on to `pagedllm serve` (last on the line)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print and save the report; exit 1 if it failed."""
    args = parse_args(argv)
    config = SoakConfig(
        clients=args.clients, duration_s=args.duration, warmup_s=args.warmup,
        disconnect_fraction=args.disconnect_fraction, bad_fraction=args.bad_fraction,
        max_prompt_words=args.max_prompt_words, max_output_tokens=args.max_output_tokens,
        stall_timeout_s=args.stall_timeout, seed=args.seed, api_key=args.api_key)
    process = None
    base_url, pid = args.base_url, args.server_pid
    if base_url is None:
        model = args.model or default_model_path()
        log_path = Path(args.output).with_suffix(".server.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        process, base_url = start_server(model, args.server_args, log_path)
        pid = process.pid
    try:
        report = asyncio.run(run_soak(base_url, config, pid))
    finally:
        exit_code = stop_server(process) if process is not None else None
    if exit_code not in (None, 0):
        report.failures.append(f"the server exited {exit_code} after SIGTERM")
    summary = {"machine": machine_info(), "config": asdict(config), "report": asdict(report),
               "passed": report.passed, "server_exit_code": exit_code}
    write_json(args.output, summary)
    print(json.dumps({k: v for k, v in asdict(report).items()
                      if k not in ("server_errors", "client_errors", "rss_samples_mib")},
                     indent=2))
    print("PASS" if report.passed else "FAIL: " + "; ".join(report.failures))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
