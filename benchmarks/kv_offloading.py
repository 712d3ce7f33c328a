"""The prefix cache's second tier (OffloadingConnector): time to first token of a long
repeated prompt after the KV cache evicted it, loaded from the tier vs computed again.

One engine per configuration, the same token ids: a `--prompt-len`-token prompt (a long
system prompt) is answered once, then `--evict` other prompts of the same length fill the
KV cache (sized by `--num-blocks` so they evict it), then the first prompt is asked again
and its TTFT (one token, greedy) is measured, `--repeats` times each, evicting in between.
With `--kv-offloading-size` the repeated prompt's blocks come from the tier (host memory, or
`--kv-offloading-path` on disk); without it they are computed. The report prints both
medians, their ratio, the tokens loaded (cached_tokens), and checks that both answers agree.

    python benchmarks/kv_offloading.py                    # default model, 4k-token prompt
    python benchmarks/kv_offloading.py --kv-offloading-path /tmp/tier --output-json r.json
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any

from common import (
    load_average,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompt,
    new_parser,
    write_json,
)


def measure(model: str, prompts: list[list[int]], args: Any, tier: bool) -> dict[str, Any]:
    """TTFTs of the repeated prompt after evictions, with or without the tier."""
    from pagedllm import LLM, SamplingParams

    options: dict[str, Any] = dict(max_model_len=args.prompt_len + 16,
                                   num_gpu_blocks_override=args.num_blocks,
                                   enable_prefix_caching=True)
    if tier:
        options["kv_offloading_size"] = args.kv_offloading_size
        options["kv_offloading_path"] = args.kv_offloading_path
    llm = LLM(model, **options)
    params = SamplingParams(temperature=0, max_tokens=1)
    repeated, others = prompts[0], prompts[1:]
    first = llm.generate({"prompt_token_ids": repeated}, params, use_tqdm=False)[0]
    times, cached = [], []
    for _ in range(args.repeats):
        for other in others:
            llm.generate({"prompt_token_ids": other}, params, use_tqdm=False)
        start = time.perf_counter()
        out = llm.generate({"prompt_token_ids": repeated}, params, use_tqdm=False)[0]
        times.append(time.perf_counter() - start)
        cached.append(out.num_cached_tokens)
        assert out.outputs[0].token_ids == first.outputs[0].token_ids, "answers differ"
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return {"ttft_s": times, "median_ttft_s": statistics.median(times),
            "cached_tokens": cached, "token": list(first.outputs[0].token_ids)}


def main() -> None:
    """Run both configurations and print the comparison."""
    parser = new_parser(__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-len", type=int, default=4096)
    parser.add_argument("--evict", type=int, default=1, help="Other prompts between repeats.")
    parser.add_argument("--num-blocks", type=int, default=300,
                        help="KV cache blocks: one prompt and a little more.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-offloading-size", type=float, default=1.0, help="GiB.")
    parser.add_argument("--kv-offloading-path", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    location = locate_model(args.model)
    tokenizer = load_tokenizer(location)
    rng = random.Random(args.seed)
    prompts = [make_prompt(tokenizer, args.prompt_len, rng) for _ in range(1 + args.evict)]
    recompute = measure(location.path, prompts, args, tier=False)
    offloaded = measure(location.path, prompts, args, tier=True)
    assert recompute["token"] == offloaded["token"], "the tier changed the answer"
    ratio = recompute["median_ttft_s"] / offloaded["median_ttft_s"]
    print(f"prompt {args.prompt_len} tokens, repeated after eviction, {args.repeats} runs")
    print(f"  recomputed:       TTFT median {recompute['median_ttft_s'] * 1000:8.1f} ms  "
          f"(cached tokens {recompute['cached_tokens']})")
    print(f"  from the tier:    TTFT median {offloaded['median_ttft_s'] * 1000:8.1f} ms  "
          f"(cached tokens {offloaded['cached_tokens']})")
    print(f"  tier speedup: {ratio:.1f}x   load average {load_average()}")
    if args.output_json:
        write_json(args.output_json, {"machine": machine_info(), "args": vars(args),
                                      "recompute": recompute, "offloaded": offloaded,
                                      "speedup": ratio})


if __name__ == "__main__":
    main()
