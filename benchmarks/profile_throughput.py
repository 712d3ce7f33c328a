"""Profile the offline throughput workload: where an engine run spends its time.

Runs the same deterministic workload as `throughput.py` (default: 64 prompts of 100-300
tokens, 128 greedy output tokens each) once under cProfile and prints the wall time and the
functions with the most time of their own, so a performance change can be checked against
its prediction.

    python benchmarks/profile_throughput.py [--num-prompts 64] [--output-len 128] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_tokenizer, locate_model, make_prompts  # noqa: E402


def main() -> None:
    """Parse arguments, run the profiled workload, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts (default: 64)")
    parser.add_argument("--output-len", type=int, default=128, help="tokens out (default: 128)")
    parser.add_argument("--top", type=int, default=25, help="functions to list (default: 25)")
    args = parser.parse_args()

    from pagedllm import LLM

    location = locate_model(args.model)
    prompts = make_prompts(load_tokenizer(location), args.num_prompts, 100, 300, seed=0)
    profiler, elapsed = profiled_pass(LLM(model=location.path), prompts, args.output_len)
    num_tokens = sum(map(len, prompts)) + args.num_prompts * args.output_len
    print(f"elapsed {elapsed:.2f} s under cProfile, {num_tokens / elapsed:.1f} total tok/s")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


def profiled_pass(llm: Any, prompts: list[list[int]], output_len: int) -> tuple[Any, float]:
    """One warmed-up greedy pass over the token-id prompts under cProfile: the profiler and
    the pass's wall time in seconds."""
    from pagedllm import SamplingParams

    inputs = [{"prompt_token_ids": ids} for ids in prompts]
    llm.generate(inputs[:4], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_len)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    llm.generate(inputs, params, use_tqdm=False)
    profiler.disable()
    return profiler, time.perf_counter() - start

if __name__ == "__main__":
    main()
