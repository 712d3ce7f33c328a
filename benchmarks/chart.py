"""Chart benchmark results: pagedllm against its peers, from throughput.py and latency.py JSON.

Reads the files written by `throughput.py --output-json` and `latency.py --output-json` and
draws horizontal bar charts, one bar per system and configuration, colored by system, with
min-max error bars over the timed iterations:

- offline throughput: total (prompt + output) tokens/s of every throughput.py configuration;
- single stream (one request): time to first token and decode tokens/s from latency.py
  (pagedllm's batch-1 row and each peer).

A missing file leaves its panels out. Older JSON files without peers work too.

    python benchmarks/chart.py
    python benchmarks/chart.py --throughput-json a.json --latency-json b.json --output out.png
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
DEFAULT_THROUGHPUT = BENCHMARKS / "results" / "throughput.json"
DEFAULT_LATENCY = BENCHMARKS / "results" / "latency.json"
DEFAULT_OUTPUT = BENCHMARKS.parent / "docs" / "benchmarks.png"
COLORS = {"pagedllm": "#1f77b4", "hf": "#ff7f0e", "llamacpp": "#2ca02c"}
OTHER_COLOR = "#7f7f7f"
PEER_NAMES = {"pagedllm": "pagedllm", "hf": "transformers", "llamacpp": "llama.cpp"}


@dataclass(frozen=True)
class Bar:
    """One bar: a system configuration's median and its min-max range."""

    label: str
    peer: str
    median: float
    low: float
    high: float


def load_json(path: Path, required: bool) -> dict[str, Any] | None:
    """A results file, or None (with a note) when it is missing and was not asked for."""
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    if required:
        raise SystemExit(f"{path} does not exist.")
    print(f"note: {path} not found; its panels are left out", file=sys.stderr)
    return None


def peer_of(record: dict[str, Any]) -> str:
    """Which system a result belongs to; older files have only the label to go by."""
    if "peer" in record:
        return str(record["peer"])
    return str(record["system"]).split(" ", 1)[0]


def bar_from(label: str, peer: str, stats: dict[str, float]) -> Bar:
    """A Bar from a summarize() record (median, min, max)."""
    return Bar(label, peer, stats["median"], stats["min"], stats["max"])


def throughput_bars(data: dict[str, Any]) -> list[Bar]:
    """Total tokens/s of every throughput.py configuration."""
    return [
        bar_from(r["system"], peer_of(r), r["summary"]["total_tokens_per_s"])
        for r in data["results"]
    ]


def single_stream_bars(data: dict[str, Any], metric: str) -> list[Bar]:
    """`ttft_ms` or `decode_tokens_per_s` of pagedllm at batch 1 and of every peer."""
    # pagedllm's rows are per batch size; for one request, its mean TTFT is the TTFT.
    engine_key = "ttft_mean_ms" if metric == "ttft_ms" else metric
    bars = [
        bar_from("pagedllm (batch 1)", "pagedllm", r["summary"][engine_key])
        for r in data.get("results", [])
        if r["batch_size"] == 1
    ]
    bars += [bar_from(r["system"], peer_of(r), r["summary"][metric]) for r in data.get("peers", [])]
    return bars


def draw_bars(ax: Any, bars: list[Bar], title: str, xlabel: str, digits: int) -> None:
    """Horizontal bars, top to bottom in the given order, with min-max error bars."""
    if not bars:
        ax.set_axis_off()
        ax.set_title(f"{title}\n(no data)")
        return
    # At least 3 slots, top down, so a panel with one or two bars does not draw them fat.
    slots = max(len(bars), 3)
    ys = [slots - 1 - i for i in range(len(bars))]
    medians = [b.median for b in bars]
    errors = [[b.median - b.low for b in bars], [b.high - b.median for b in bars]]
    colors = [COLORS.get(b.peer, OTHER_COLOR) for b in bars]
    ax.barh(ys, medians, height=0.7, xerr=errors, color=colors, capsize=3, ecolor="#333333")
    ax.set_ylim(-0.6, slots - 0.4)
    ax.set_yticks(ys, [b.label for b in bars], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    limit = max(b.high for b in bars)
    ax.set_xlim(0, limit * 1.18)  # room for the value labels
    for y, bar in zip(ys, bars, strict=True):
        ax.text(bar.high + limit * 0.01, y, f"{bar.median:.{digits}f}", va="center", fontsize=8)


def model_name(throughput: dict[str, Any] | None, latency: dict[str, Any] | None) -> str:
    """The model file's name, from whichever results file names it."""
    for data, key in ((throughput, "model_path"), (latency, "model")):
        if data and data["config"].get(key):
            return Path(str(data["config"][key])).name
    return "unknown model"


def describe(throughput: dict[str, Any] | None, latency: dict[str, Any] | None) -> str:
    """The figure's subtitle: machine and workloads."""
    parts = []
    source = throughput or latency or {}
    machine = source.get("machine", {})
    if machine:
        parts.append(
            f"{machine.get('cpu_model', '?')}, {machine.get('cpu_count', '?')} cores, "
            f"torch {machine.get('torch_version', '?')}, {str(machine.get('date', ''))[:10]}"
        )
    if throughput:
        cfg, prompts = throughput["config"], throughput.get("prompts", {})
        parts.append(
            f"offline: {prompts.get('num_prompts', cfg.get('num_prompts'))} prompts of "
            f"{cfg.get('input_len_min')}-{cfg.get('input_len_max')} tokens, "
            f"{cfg.get('output_len')} out, greedy, EOS ignored"
        )
    if latency:
        cfg = latency["config"]
        parts.append(f"single stream: {cfg.get('input_len')} in / {cfg.get('output_len')} out")
    parts.append("bars: median of the timed iterations; whiskers: min-max")
    return "\n".join(parts)


def make_figure(throughput: dict[str, Any] | None, latency: dict[str, Any] | None) -> Any:
    """The figure: throughput on top (full width), TTFT and decode side by side below."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t_bars = throughput_bars(throughput) if throughput else []
    rows = [bool(t_bars), latency is not None]
    heights = [max(2.0, 0.32 * len(t_bars) + 1.2)] * rows[0] + [3.6] * rows[1]
    fig = plt.figure(figsize=(12, sum(heights) + 1.2))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights)
    row = 0
    if rows[0]:
        ax = fig.add_subplot(grid[row, :])
        draw_bars(ax, t_bars, "Offline throughput (higher is better)", "total tokens/s", 0)
        row += 1
    if latency is not None:
        ttft = single_stream_bars(latency, "ttft_ms")
        decode = single_stream_bars(latency, "decode_tokens_per_s")
        title = "Single stream: time to first token (lower is better)"
        draw_bars(fig.add_subplot(grid[row, 0]), ttft, title, "TTFT ms", 1)
        title = "Single stream: decode speed (higher is better)"
        draw_bars(fig.add_subplot(grid[row, 1]), decode, title, "decode tokens/s", 1)
    peers = {b.peer for b in t_bars}
    if latency is not None:
        peers |= {b.peer for b in single_stream_bars(latency, "ttft_ms")}
    handles = [
        Patch(color=COLORS.get(p, OTHER_COLOR), label=PEER_NAMES.get(p, p))
        for p in PEER_NAMES
        if p in peers
    ]
    fig.legend(handles=handles, loc="upper right", fontsize=9, frameon=False)
    fig.suptitle(f"pagedllm vs peers: {model_name(throughput, latency)}", x=0.02, ha="left")
    fig.text(
        0.02,
        0.995 - 0.5 / fig.get_figheight(),
        describe(throughput, latency),
        fontsize=8,
        va="top",
        color="#444444",
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.95 / fig.get_figheight()))
    return fig


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import new_parser  # the benchmarks' shared helpers (plain stdlib imports)

    p = new_parser(__doc__)
    add = p.add_argument
    add(
        "--throughput-json",
        default=str(DEFAULT_THROUGHPUT),
        metavar="PATH",
        help="a throughput.py result (the default file is skipped if missing)",
    )
    add(
        "--latency-json",
        default=str(DEFAULT_LATENCY),
        metavar="PATH",
        help="a latency.py result (the default file is skipped if missing)",
    )
    add("--output", default=str(DEFAULT_OUTPUT), metavar="PATH", help="the PNG to write")
    add("--dpi", type=int, default=120, help="resolution of the PNG")
    return p


def main(argv: list[str] | None = None) -> None:
    """Load the result files, draw the figure, save the PNG."""
    args = build_parser().parse_args(argv)
    # A path given on the command line must exist; a default one may be absent.
    throughput = load_json(
        Path(args.throughput_json), args.throughput_json != str(DEFAULT_THROUGHPUT)
    )
    latency = load_json(Path(args.latency_json), args.latency_json != str(DEFAULT_LATENCY))
    if throughput is None and latency is None:
        raise SystemExit("nothing to chart: no throughput or latency results found.")
    fig = make_figure(throughput, latency)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=args.dpi)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
