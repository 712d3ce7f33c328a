"""Decode at batch 1 on a GPU, as a fraction of its memory-bandwidth roofline.

One request (a `--prompt-len`-token prompt) decodes `--output-len` tokens greedily with EOS
ignored; the time per output token is the median interval between engine steps after its
first token (prefill excluded). A decode step has to read every weight once, as stored on
the device (a quantized matrix's codes, scales and minimums; norms; the LM head; not the
embedding table, of which it reads one row), plus the request's KV cache. At the GPU's
memory bandwidth that is the step's floor:

    floor = (weight bytes + KV bytes at the mean context) / bandwidth
    fraction of the roofline = floor / measured time per token   (1.0 = at the roofline)

The bandwidth is measured here (a device-to-device copy of `--bandwidth-gib` GiB: bytes
read plus written per second, best of 5), and the GPU's name is recorded with the result.

    python benchmarks/cuda_decode.py                        # the default model, CUDA graphs
    python benchmarks/cuda_decode.py --enforce-eager        # the same without graphs
    python benchmarks/cuda_decode.py --output-json benchmarks/results/cuda_decode.json

Offline throughput against transformers on the same GPU: benchmarks/throughput.py
--device cuda --compare hf.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from common import (
    add_model_arg,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompts,
    new_parser,
    run_engine_pass,
    write_json,
)
from step_bytes import weight_bytes


def measure_bandwidth(gib: float) -> float:
    """Device memory bandwidth in bytes/s: a copy reads and writes every byte once."""
    import torch

    numel = int(gib * (1 << 30)) // 4
    src = torch.empty(numel, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * src.nbytes / best


def weight_bytes_per_step(model: Any) -> int:
    """Bytes a decode step reads of the weights (step_bytes.py: each layer's quantized copy
    as stored where it has one, else its weight; the LM head; norms and biases)."""
    return sum(weight_bytes(model).values())


def kv_bytes_per_token(model_config: Any, cache_dtype_bytes: int) -> int:
    """KV cache bytes of one position over all layers (K and V)."""
    hf = model_config.hf_config
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    return 2 * hf.num_hidden_layers * kv_heads * head_dim * cache_dtype_bytes


def kernels_per_token(engine: Any, prompt: Any, tokens: int = 16) -> float | None:
    """GPU operations (kernels, copies) one decoded token launches, read by torch's
    profiler: a pass of 1 + `tokens` tokens less a pass of 1, over `tokens` (prefill and
    first token cancel out). None where the profiler cannot see the device."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def count(max_tokens: int) -> int:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run_engine_pass(engine, [prompt], max_tokens)
        return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)

    try:
        return (count(1 + tokens) - count(1)) / tokens
    except RuntimeError as error:  # no CUPTI
        print(f"kernels per token not measured: {error}")
        return None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from pagedllm import LLM

    location = locate_model(args.model)
    llm = LLM(model=location.path, device="cuda", enforce_eager=args.enforce_eager,
              dtype=args.dtype, quantization=args.quantization,
              max_model_len=args.prompt_len + args.output_len + 16, seed=0)
    engine = llm.llm_engine
    worker = engine.engine_core.engine_core.executor.worker
    prompt = make_prompts(load_tokenizer(location), 1, args.prompt_len, args.prompt_len)[0]
    run_engine_pass(engine, [prompt], 16)  # warm-up (kernels compiled, graphs captured)
    timings = []
    for _ in range(args.num_iters):
        record = run_engine_pass(engine, [prompt], args.output_len)
        times = [t for t, n in record.steps if n]
        timings.extend(b - a for a, b in zip(times, times[1:], strict=False))
    per_token = statistics.median(timings)
    kernels = kernels_per_token(engine, prompt)
    bandwidth = measure_bandwidth(args.bandwidth_gib)
    weights = weight_bytes_per_step(worker.model)
    cache_bytes = worker.kv_caches[0].element_size()
    mean_context = args.prompt_len + args.output_len / 2
    kv = kv_bytes_per_token(engine.engine_config.model_config, cache_bytes) * mean_context
    floor = (weights + kv) / bandwidth
    result = {
        "gpu": torch.cuda.get_device_name(),
        "model": location.path,
        "cuda_graphs": worker.model_runner.decode_step is not None,
        "quantization": engine.engine_config.model_config.quantization,
        "dtype": engine.engine_config.model_config.dtype,
        "ms_per_token": per_token * 1e3,
        "tokens_per_s": 1 / per_token,
        "weight_bytes": weights,
        "kv_bytes_mean": kv,
        "bandwidth_gb_s": bandwidth / 1e9,
        "floor_ms": floor * 1e3,
        "fraction_of_roofline": floor / per_token,
        "kernels_per_token": kernels,
        "machine": machine_info(),
    }
    print(
        f"{result['gpu']}: {result['ms_per_token']:.3f} ms/token at batch 1 "
        f"({result['tokens_per_s']:.0f} tok/s, graphs={result['cuda_graphs']}); reads "
        f"{(weights + kv) / 1e6:.1f} MB/step at {bandwidth / 1e9:.0f} GB/s = floor "
        f"{floor * 1e3:.3f} ms: {result['fraction_of_roofline']:.0%} of the roofline; "
        f"{kernels if kernels is None else round(kernels)} GPU operations per token"
    )
    if args.output_json:
        write_json(args.output_json, {"config": vars(args), "result": result})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = new_parser(__doc__)
    add_model_arg(p)
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=256, help="decoded tokens per pass")
    p.add_argument("--num-iters", type=int, default=3, help="timed passes")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--dtype", default="auto", help="the engine's dtype")
    p.add_argument("--quantization", default=None,
                   help="int4 / int8 / none (default: the checkpoint's; a GGUF's own codes)")
    p.add_argument("--bandwidth-gib", type=float, default=1.0, help="copy size to measure")
    p.add_argument("--output-json", default=None, metavar="PATH", help="write results here")
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
