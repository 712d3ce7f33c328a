"""How long loading the model takes: `LLM(model)` in a fresh process, cold and warm.

Each measurement runs in a new Python process (so nothing is cached in memory) and times
`LLM(model, max_model_len=...)` from the call to the engine being ready, after pagedllm is
imported (import time is reported apart). Cold: an empty `PAGEDLLM_CACHE_DIR`, so the CPU
kernels are compiled and the GGUF's config, tokenizer and tensor index are converted, as on
a user's first run. Warm: the same cache again, as on every later run. With `--compare
llamacpp`, llama-cpp-python's `Llama(model_path)` on the same file, warm, for reference.

    python benchmarks/load_time.py --num-iters 3 --output-json benchmarks/results/load_time.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile

from common import add_model_arg, locate_model, machine_info, new_parser, write_json

_PAGEDLLM = """
import json, sys, time
start = time.perf_counter()
from pagedllm import LLM
imported = time.perf_counter()
LLM({model!r}, max_model_len={max_model_len})
ready = time.perf_counter()
print(json.dumps({{"import_s": imported - start, "load_s": ready - imported}}))
"""
_LLAMACPP = """
import json, time
import llama_cpp
start = time.perf_counter()
llama_cpp.Llama(model_path={model!r}, n_ctx={max_model_len}, verbose=False)
print(json.dumps({{"load_s": time.perf_counter() - start}}))
"""


def run_child(code: str, env_cache: str | None) -> dict[str, float]:
    """Run `code` in a fresh interpreter (with PAGEDLLM_CACHE_DIR set) and parse its JSON."""
    import os

    env = dict(os.environ)
    if env_cache is not None:
        env["PAGEDLLM_CACHE_DIR"] = env_cache
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    """Time cold and warm loads (and llama.cpp's), print them, write the JSON."""
    parser = new_parser(__doc__)
    add_model_arg(parser)
    parser.add_argument("--num-iters", type=int, default=3, help="loads of each kind")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--compare", choices=["llamacpp"], default=None)
    parser.add_argument("--output-json", default=None, metavar="PATH")
    args = parser.parse_args()
    path = locate_model(args.model).path
    code = _PAGEDLLM.format(model=path, max_model_len=args.max_model_len)
    results: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    for _ in range(args.num_iters):
        with tempfile.TemporaryDirectory() as cache:
            results["cold"].append(run_child(code, cache))  # compiles and converts
            results["warm"].append(run_child(code, cache))  # reads what the first made
    if args.compare == "llamacpp":
        lcp = _LLAMACPP.format(model=path, max_model_len=args.max_model_len)
        results["llamacpp"] = [run_child(lcp, None) for _ in range(args.num_iters)]
    for kind, runs in results.items():
        line = f"{kind:>9}: load {summary([r['load_s'] for r in runs])}"
        if "import_s" in runs[0]:
            line += f" (import {summary([r['import_s'] for r in runs])})"
        print(line)
    if args.output_json:
        write_json(args.output_json, {
            "benchmark": "load_time", "config": vars(args), "machine": machine_info(),
            "results": results,
        })
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
