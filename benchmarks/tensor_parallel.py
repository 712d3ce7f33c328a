"""Tensor parallelism's per-step cost on this machine: the default model at TP=1 (one
process, all cores) and TP=2 (two worker processes, half the cores each), same prompts, same
run, plus the collectives of one TP=2 decode step timed alone over gloo.

A Llama-style decoder split over two ranks makes, per forward pass, two all-reduces a layer
(after o_proj and down_proj: the row-parallel layers), one for the vocabulary-parallel
embedding, and one gather of the LM head's shares for the tokens that sample (an all-gather
of [tokens, vocab/2] logits; for greedy steps a [tokens, 2] one of each rank's best). The
collectives are timed on tensors of those shapes between two processes, and multiplied by
their count; the engine passes give the whole step (decode: one request, and a batch).

    python benchmarks/tensor_parallel.py
    python benchmarks/tensor_parallel.py --batch 32 --output-json benchmarks/results/tp.json
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_model_arg, machine_info, make_prompts, new_parser, write_json  # noqa: E402


def _time_collectives(rank: int, init_file: str, shapes: dict[str, Any], iters: int,
                      results: Any) -> None:
    """One of two gloo ranks: the mean seconds of each collective in `shapes`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", world_size=2, rank=rank)
    timings = {}
    for name, (kind, shape, dtype) in shapes.items():
        tensor = torch.randn(shape).to(dtype)
        parts = [torch.empty_like(tensor) for _ in range(2)]
        for _ in range(10):  # warm-up
            dist.all_reduce(tensor) if kind == "all_reduce" else dist.all_gather(parts, tensor)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor) if kind == "all_reduce" else dist.all_gather(parts, tensor)
        timings[name] = (time.perf_counter() - start) / iters
    if rank == 0:
        results.update(timings)
    dist.destroy_process_group()


def time_collectives(hidden: int, vocab: int, dtype: Any, tokens: int, iters: int
                     ) -> dict[str, float]:
    """Seconds per collective of a TP=2 step of `tokens` tokens (two spawned processes)."""
    import torch
    import torch.multiprocessing as mp

    shapes = {
        "all_reduce_hidden": ("all_reduce", (tokens, hidden), dtype),
        "all_gather_logits": ("all_gather", (tokens, -(-vocab // 2)), torch.float32),
        "all_gather_best": ("all_gather", (tokens, 2), torch.float64),
    }
    with tempfile.TemporaryDirectory() as folder, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_time_collectives, args=(f"{folder}/init", shapes, iters, results), nprocs=2)
        return dict(results)


def decode_pass(llm: Any, prompts: list[list[int]], output_len: int) -> float:
    """Output tokens per second of one pass (all prompts added at once, greedy)."""
    from pagedllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def engine_passes(args: Any, tp: int) -> dict[str, Any]:
    """Single-stream and batched output tok/s at tensor_parallel_size=tp."""
    from pagedllm import LLM

    llm = LLM(args.model, tensor_parallel_size=tp, enable_prefix_caching=False)
    try:
        prompts = make_prompts(llm.get_tokenizer(), args.batch, args.input_len,
                               args.input_len, seed=0)
        decode_pass(llm, prompts[:2], 8)  # warm-up
        single = [decode_pass(llm, prompts[:1], args.output_len) for _ in range(args.num_iters)]
        batched = [decode_pass(llm, prompts, args.output_len) for _ in range(args.num_iters)]
        config = llm.llm_engine.engine_config.model_config
        return {
            "single_tok_s": statistics.median(single), "batch_tok_s": statistics.median(batched),
            "dtype": str(config.dtype), "hf_config": config.hf_config,
        }
    finally:
        llm.llm_engine.shutdown()


def main() -> None:
    parser = new_parser(__doc__)
    add_model_arg(parser)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-iters", type=int, default=2)
    parser.add_argument("--collective-iters", type=int, default=300)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    if args.model is None:
        from common import default_model_path

        args.model = default_model_path()
    import torch

    one, two = engine_passes(args, 1), engine_passes(args, 2)
    hf = one.pop("hf_config")
    two.pop("hf_config")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(one["dtype"],
                                                                       torch.float32)
    layers, hidden, vocab = hf.num_hidden_layers, hf.hidden_size, hf.vocab_size
    num_all_reduces = 2 * layers + 1
    result: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "tp1": one,
                              "tp2": two, "all_reduces_per_step": num_all_reduces}
    print(f"{args.model}: {layers} layers, hidden {hidden}, vocab {vocab}, {one['dtype']}")
    print(f"per TP=2 forward: {num_all_reduces} all-reduces of [tokens, {hidden}] "
          f"+ 1 all-gather at the LM head")
    for tokens, label, tp1, tp2 in ((1, "1 request", one["single_tok_s"], two["single_tok_s"]),
                                    (args.batch, f"{args.batch} requests", one["batch_tok_s"],
                                     two["batch_tok_s"])):
        timing = time_collectives(hidden, vocab, dtype, tokens, args.collective_iters)
        step1, step2 = tokens / tp1, tokens / tp2  # seconds per decode step
        collectives = num_all_reduces * timing["all_reduce_hidden"] + timing["all_gather_best"]
        result[f"decode_{tokens}"] = {
            "tp1_step_ms": 1e3 * step1, "tp2_step_ms": 1e3 * step2,
            "all_reduce_us": 1e6 * timing["all_reduce_hidden"],
            "all_gather_logits_us": 1e6 * timing["all_gather_logits"],
            "all_gather_best_us": 1e6 * timing["all_gather_best"],
            "collectives_ms": 1e3 * collectives,
        }
        print(f"decode, {label}: TP=1 {tp1:.1f} tok/s ({1e3 * step1:.2f} ms/step), TP=2 "
              f"{tp2:.1f} tok/s ({1e3 * step2:.2f} ms/step) = {tp2 / tp1:.2f}x; one all-reduce "
              f"{1e6 * timing['all_reduce_hidden']:.0f} us, {num_all_reduces} of them + the "
              f"greedy gather {1e3 * collectives:.2f} ms/step "
              f"({100 * collectives / step2:.0f}% of the TP=2 step); a full-logits gather "
              f"would add {1e6 * timing['all_gather_logits']:.0f} us")
    if args.output_json:
        write_json(args.output_json, result)


if __name__ == "__main__":
    main()
