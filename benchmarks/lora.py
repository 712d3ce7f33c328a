"""Multi-LoRA throughput: 64 requests over 8 adapters vs the same requests on the base model.

Eight random rank-`--rank` PEFT adapters (q/k/v/o and gate/up/down, made with peft on the
default model's own architecture and saved once under `--work-dir`) are served by one
engine (`enable_lora=True, max_loras=8`); `--num-requests` deterministic prompts of
`--input-len` tokens, each assigned an adapter round-robin, generate `--output-len` tokens
(greedy, EOS ignored), all added at once. The same prompts are then run with no adapter on
the same engine. Printed: output tok/s of both and their ratio (the issue asks >= 0.7).

    python benchmarks/lora.py
    python benchmarks/lora.py --num-requests 32 --output-json benchmarks/results/lora.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, make_prompts, new_parser, write_json  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(args: Any, count: int) -> list[str]:
    """`count` random PEFT adapters for the default model (made once, then reused)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from pagedllm.engine.arg_utils import EngineArgs

    folder = Path(args.work_dir) / f"lora_r{args.rank}"
    paths = [folder / f"adapter{i}" for i in range(count)]
    if all((p / "adapter_config.json").is_file() for p in paths):
        return [str(p) for p in paths]
    model_config = EngineArgs(model=args.model).create_engine_config().model_config
    for index, path in enumerate(paths):
        torch.manual_seed(index)
        base = AutoModelForCausalLM.from_pretrained(
            model_config.model_dir, gguf_file=model_config.gguf_file, dtype="float32"
        )
        config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=TARGETS,
                            lora_dropout=0.0, init_lora_weights=False)
        model = get_peft_model(base, config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.normal_(0.0, 0.01)
        model.save_pretrained(path)
    return [str(p) for p in paths]


def run_pass(llm: Any, prompts: list[list[int]], loras: list[Any], args: Any) -> float:
    """Output tok/s of one pass."""
    from pagedllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                           use_tqdm=False, lora_request=loras)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def main() -> None:
    parser = new_parser(__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--num-adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-iters", type=int, default=2)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--work-dir", default=str(Path.home() / ".cache" / "pagedllm-bench"))
    args = parser.parse_args()

    from pagedllm import LLM
    from pagedllm.lora.request import LoRARequest

    paths = make_adapters(args, args.num_adapters)
    llm = LLM(args.model, enable_lora=True, max_loras=args.num_adapters,
              max_cpu_loras=args.num_adapters, max_lora_rank=args.rank,
              enable_prefix_caching=False)
    prompts = make_prompts(llm.get_tokenizer(), args.num_requests, args.input_len,
                           args.input_len, seed=0)
    adapters = [LoRARequest(f"adapter{i}", i + 1, p) for i, p in enumerate(paths)]
    loras = [adapters[i % len(adapters)] for i in range(args.num_requests)]
    run_pass(llm, prompts[:4], loras[:4], args)  # warm-up: adapters loaded, kernels ready
    base, mixed = [], []
    for _ in range(args.num_iters):
        base.append(run_pass(llm, prompts, [None] * len(prompts), args))
        mixed.append(run_pass(llm, prompts, loras, args))
    result = {
        "machine": machine_info(), "args": vars(args),
        "base_output_tokens_per_s": statistics.median(base), "base_passes": base,
        "lora_output_tokens_per_s": statistics.median(mixed), "lora_passes": mixed,
    }
    result["ratio"] = result["lora_output_tokens_per_s"] / result["base_output_tokens_per_s"]
    print(f"base only: {result['base_output_tokens_per_s']:.1f} tok/s; "
          f"{args.num_adapters} adapters of rank {args.rank}: "
          f"{result['lora_output_tokens_per_s']:.1f} tok/s = {result['ratio']:.2f}x")
    if args.output_json:
        write_json(args.output_json, result)


if __name__ == "__main__":
    main()
