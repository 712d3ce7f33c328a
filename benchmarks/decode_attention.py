"""The CPU decode attention kernel alone, with the KV cache cold as it is in a model's step.

A decode step attends every layer's own KV cache after the step's weights have passed
through the caches, so each layer's rows come from memory. This benchmark keeps one
bfloat16 cache per layer (`--layers`, shaped as the default model's: 3 kv heads of 64,
9 query heads, blocks of 16 positions, 2,912 blocks), gives `--requests` requests a context
of `--context` positions each in shuffled blocks, and times one call per layer in turn
(their caches together far larger than the L3), against the same calls repeated on the
first layer's cache alone (hot: the rows stay cached). It prints ms per step of all layers,
the KV bytes read and the rate, so a change to paged_attention.c can be measured in seconds
instead of through whole engine runs (BENCHMARKS.md, "Where a batched decode step goes").

    python benchmarks/decode_attention.py
    python benchmarks/decode_attention.py --requests 1 --context 2048
"""

from __future__ import annotations

from typing import Any

from common import format_stat, machine_info, new_parser, time_calls, write_json

NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, NUM_HEADS, HEAD_SIZE = 2912, 16, 3, 9, 64


def step_calls(requests: int, context: int, layers: int, seed: int = 0) -> tuple[Any, Any]:
    """(cold, hot): callables running one decode attention call per layer, the cold one on
    each layer's own cache, the hot one on the first layer's every time."""
    import torch

    from pagedllm.attention.cpu_kernel import paged_decode_attention

    gen = torch.Generator().manual_seed(seed)
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    caches = [torch.randn(shape, generator=gen).bfloat16() for _ in range(layers)]
    query = torch.randn(requests, NUM_HEADS, HEAD_SIZE, generator=gen).bfloat16()
    out = torch.empty_like(query)
    blocks_each = -(-context // BLOCK_SIZE)
    if requests * blocks_each >= NUM_BLOCKS:
        raise SystemExit(f"{requests} x {context} positions do not fit {NUM_BLOCKS} blocks.")
    ids = torch.randperm(NUM_BLOCKS - 1, generator=gen)[: requests * blocks_each] + 1
    tables = ids.view(requests, blocks_each).to(torch.int32).contiguous()
    seq_lens = torch.full((requests,), context, dtype=torch.int32)
    rows = torch.arange(requests, dtype=torch.int32)

    def call(cache: Any) -> None:
        paged_decode_attention(out, query, cache, tables, seq_lens, rows, context,
                               HEAD_SIZE**-0.5)

    def cold() -> None:
        for cache in caches:
            call(cache)

    def hot() -> None:
        for _ in caches:
            call(caches[0])

    return cold, hot


def main(argv: list[str] | None = None) -> None:
    """Time the cold and hot steps, print them with the bytes read and the rate."""
    parser = new_parser(__doc__)
    parser.add_argument("--requests", type=int, default=32, help="decode requests a call")
    parser.add_argument("--context", type=int, default=400, help="positions each attends")
    parser.add_argument("--layers", type=int, default=30, help="caches (one per layer)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps")
    parser.add_argument("--output-json", default=None, metavar="PATH", help="write results")
    args = parser.parse_args(argv)
    if min(args.requests, args.context, args.layers, args.repeats) < 1:
        parser.error("--requests, --context, --layers and --repeats must be at least 1.")
    import torch

    from pagedllm.attention import cpu_kernel

    if not cpu_kernel.is_available(torch.bfloat16):
        parser.error("the CPU attention kernel is not built here (no C compiler?).")
    cold, hot = step_calls(args.requests, args.context, args.layers)
    megabytes = args.layers * args.requests * args.context * NUM_KV_HEADS * HEAD_SIZE * 4 / 1e6
    results = {}
    for name, step in (("cold", cold), ("hot", hot)):
        stats = time_calls(step, args.repeats)  # ms per step: all layers' calls
        rate = megabytes / stats["median"]  # MB per ms = GB/s
        results[name] = {"ms": stats, "gb_per_s": rate}
        print(f"{name}: {format_stat(stats, 2)} ms a step of {args.layers} layers, "
              f"{megabytes:.0f} MB of KV, {rate:.1f} GB/s")
    if args.output_json:
        write_json(args.output_json, {"config": vars(args), "machine": machine_info(),
                                      "results": results})


if __name__ == "__main__":
    main()
