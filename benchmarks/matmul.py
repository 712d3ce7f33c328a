"""The CPU matmuls of quantized bf16 models against torch's own dense matmul, at the model's shapes.

For each step size (`--tokens`) and each matrix of the default model's decoder layers (fused
QKV 576->960, o_proj 576->576, fused gate-up 576->3072, down 1536->576) and its LM head
(576->49152), times on random weights: our W4A8 kernel (int4 groups of 32 x int8 activations),
our W8A8 kernel (the LM head's Q8_0 form), our dense bf16 kernel (the same bf16 weight in
panels: `vdpbf16ps`, or its emulation), and torch's best dense matmul on this CPU (the
path the engine would otherwise take): oneDNN's bf16 matmul with a prepacked weight where
bf16 matmuls are native, float32 `F.linear` (MKL / oneDNN) elsewhere. The kernels run the
variant this CPU gets (`PAGEDLLM_CPU_ISA` forces one; emulate an AVX2 machine with
`MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` too). Median
and spread of `--repeats` timed calls after one warm-up; prints ms and each kernel's speedup
over the dense baseline.

    python benchmarks/matmul.py
    python benchmarks/matmul.py --tokens 1,64,512 --output-json benchmarks/results/matmul.json
"""

from __future__ import annotations

from common import (
    format_stat,
    machine_info,
    new_parser,
    positive_int_list,
    time_calls,
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


def measure_shape(in_features: int, out_features: int, tokens: int, repeats: int) -> dict:
    """Times of the four matmuls for one matrix shape and step size."""
    import torch

    from pagedllm.layers.quantization import Bf16PanelWeight, quantize_w4a8, quantize_w8a8
    from pagedllm.layers.quantization.dense import (
        can_pack_for_cpu,
        pack_weight_for_cpu,
        packed_linear,
    )

    gen = torch.Generator().manual_seed(in_features + out_features)
    weight = (torch.randn(out_features, in_features, generator=gen) * 0.05).bfloat16()
    x = torch.randn(tokens, in_features, generator=gen).bfloat16()
    w4a8, w8a8 = quantize_w4a8(weight), quantize_w8a8(weight)
    panels = Bf16PanelWeight.from_weight(weight)
    if can_pack_for_cpu(weight):  # native bf16: oneDNN's packed layout
        packed = pack_weight_for_cpu(weight)
        dense = lambda: packed_linear(x, packed, None)  # noqa: E731
    else:  # float32, what dtype="auto" runs dense weights in here
        weight32, x32 = weight.float(), x.float()
        dense = lambda: torch.nn.functional.linear(x32, weight32)  # noqa: E731
    return {
        "dense_ms": time_calls(dense, repeats),
        "w4a8_ms": time_calls(lambda: w4a8.matmul(x), repeats),
        "w8a8_ms": time_calls(lambda: w8a8.matmul(x), repeats),
        "bf16_ms": time_calls(lambda: panels.apply(x, None), repeats),
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
    from pagedllm.platform import cpu_platform

    loaded = cpu_platform().kernel_library()
    dense_name = "bf16 oneDNN" if cpu_platform().native_bf16_matmuls() else "fp32 torch"
    print(f"kernels: {loaded.variant.name if loaded else None}; dense baseline: {dense_name}")
    print(f"{'shape':<10} {'tokens':>6} {dense_name + ' ms':>22} {'W4A8 ms':>22} {'W8A8 ms':>22} "
          f"{'bf16 panels ms':>22} {'W4A8/dense':>10} {'W8A8/dense':>10} {'bf16/dense':>10}")
    rows = []
    for tokens in args.tokens:
        for name, in_features, out_features in SHAPES:
            result = measure_shape(in_features, out_features, tokens, args.repeats)
            dense = result["dense_ms"]["median"]
            speedups = {
                kernel: dense / result[f"{kernel}_ms"]["median"]
                for kernel in ("w4a8", "w8a8", "bf16")
            }
            print(
                f"{name:<10} {tokens:>6} {format_stat(result['dense_ms'], 3):>22} "
                f"{format_stat(result['w4a8_ms'], 3):>22} {format_stat(result['w8a8_ms'], 3):>22} "
                f"{format_stat(result['bf16_ms'], 3):>22} {speedups['w4a8']:>9.2f}x "
                f"{speedups['w8a8']:>9.2f}x {speedups['bf16']:>9.2f}x"
            )
            rows.append({"shape": name, "in": in_features, "out": out_features,
                         "tokens": tokens, **result, "speedup_over_dense": speedups})
    if args.output_json:
        write_json(args.output_json, {
            "benchmark": "matmul", "config": vars(args), "machine": machine_info(),
            "kernel_variant": loaded.variant.name if loaded else None,
            "dense_baseline": dense_name, "results": rows,
        })
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
