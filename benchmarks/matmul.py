"""The CPU matmuls of quantized bf16 models against oneDNN's bf16 matmul, at the model's shapes.

For each step size (`--tokens`) and each matrix of the default model's decoder layers (fused
QKV 576->960, o_proj 576->576, fused gate-up 576->3072, down 1536->576) and its LM head
(576->49152), times on random weights: our W4A8 kernel (int4 groups of 32 x int8 activations),
our W8A8 kernel (the LM head's Q8_0 form), and oneDNN's bf16 matmul with a prepacked weight
(what the engine used before W4A8 served every step). Median and spread of `--repeats` timed
calls after one warm-up; prints ms and the speedup of each kernel over bf16.

    python benchmarks/matmul.py
    python benchmarks/matmul.py --tokens 1,64,512 --output-json benchmarks/results/matmul.json
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from common import (
    format_stat,
    machine_info,
    new_parser,
    positive_int_list,
    summarize,
    write_json,
)

# (name, in_features, out_features) of SmolLM2-135M's matrices.
SHAPES = (
    ("qkv", 576, 960),
    ("o_proj", 576, 576),
    ("gate_up", 576, 3072),
    ("down", 1536, 576),
    ("lm_head", 576, 49152),
)


def time_calls(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Milliseconds per call of `fn`: median, min, max, spread over `repeats` calls."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return summarize(times)


def measure_shape(in_features: int, out_features: int, tokens: int, repeats: int) -> dict:
    """Times of the three matmuls for one matrix shape and step size."""
    import torch

    from pagedllm.layers.linear import pack_weight_for_cpu, packed_linear
    from pagedllm.layers.quantization import quantize_w4a8, quantize_w8a8

    gen = torch.Generator().manual_seed(in_features + out_features)
    weight = (torch.randn(out_features, in_features, generator=gen) * 0.05).bfloat16()
    x = torch.randn(tokens, in_features, generator=gen).bfloat16()
    w4a8, w8a8 = quantize_w4a8(weight), quantize_w8a8(weight)
    packed = pack_weight_for_cpu(weight)
    return {
        "bf16_onednn_ms": time_calls(lambda: packed_linear(x, packed, None), repeats),
        "w4a8_ms": time_calls(lambda: w4a8.matmul(x), repeats),
        "w8a8_ms": time_calls(lambda: w8a8.matmul(x), repeats),
    }


def main(argv: list[str] | None = None) -> None:
    """Measure every shape at every step size, print the table, write the JSON."""
    parser = new_parser(__doc__)
    parser.add_argument(
        "--tokens", type=positive_int_list, default=[1, 4, 8, 64, 256, 1024],
        help="comma list of step sizes (rows of the activation)",
    )
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--output-json", default=None, metavar="PATH", help="write results")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1.")
    from pagedllm.layers import cpu_ops

    if not cpu_ops.w4a8_available():
        parser.error("the W4A8 kernel is not built here (no C compiler, or not a bf16 CPU path).")
    print(f"{'shape':<10} {'tokens':>6} {'bf16 oneDNN ms':>22} {'W4A8 ms':>22} {'W8A8 ms':>22} "
          f"{'W4A8/bf16':>9} {'W8A8/bf16':>9}")
    rows = []
    for tokens in args.tokens:
        for name, in_features, out_features in SHAPES:
            result = measure_shape(in_features, out_features, tokens, args.repeats)
            bf16 = result["bf16_onednn_ms"]["median"]
            speedups = {
                kernel: bf16 / result[f"{kernel}_ms"]["median"] for kernel in ("w4a8", "w8a8")
            }
            print(
                f"{name:<10} {tokens:>6} {format_stat(result['bf16_onednn_ms'], 3):>22} "
                f"{format_stat(result['w4a8_ms'], 3):>22} {format_stat(result['w8a8_ms'], 3):>22} "
                f"{speedups['w4a8']:>8.2f}x {speedups['w8a8']:>8.2f}x"
            )
            rows.append({"shape": name, "in": in_features, "out": out_features,
                         "tokens": tokens, **result, "speedup_over_bf16": speedups})
    if args.output_json:
        write_json(args.output_json, {"benchmark": "matmul", "config": vars(args),
                                      "machine": machine_info(), "results": rows})
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
