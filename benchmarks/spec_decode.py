"""Speculative decoding: decode speed with and without drafts, same run, same outputs.

Workload: chat prompts whose answers copy from the prompt, as edits and extractions do:
"rewrite this code with one change" over several Python snippets, and "quote the sentences
that mention X" over passages. Each prompt is answered greedily (`--output-len` tokens at
most) by the default model, first without speculation and then with each method of
`--methods`; the outputs must be token-identical.

Measured:
- single stream: one request at a time; decode tok/s = (output tokens - 1) / (end - first
  token), summed over the prompts; the ratio to no speculation is the headline;
- batch `--batch-size`: every prompt repeated to that many requests, all added at once;
  output tok/s of the whole pass. With the default policy (`disable_by_batch_size`) drafts
  stop above a few running requests, so the batch pays only the policy's check; the same
  batch with the policy off (`--no-policy-run` skips it) shows what verifying would cost.
- the acceptance: drafts, draft tokens, accepted tokens, mean acceptance length.

Methods: `ngram` (`--k`, `--lookup-min`, `--lookup-max`); `draft:PATH` for a draft model (a
folder or .gguf sharing the target's tokenizer); `draft-layers:N` for the target's own first
N layers and LM head as a draft (saved once as a folder: the best draft there is for a
model without a smaller sibling here); `eagle`, `eagle3`, `medusa` for random heads sized
for the target (their acceptance means nothing: they measure the overhead).

    python benchmarks/spec_decode.py
    python benchmarks/spec_decode.py --methods ngram,draft-layers:8,eagle,medusa \
        --output-json out.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, new_parser, write_json  # noqa: E402

CODE_SNIPPETS = [
    '''def merge_sorted(left, right):
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result
''',
    '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())
''',
    '''import json


def load_config(path):
    with open(path) as handle:
        config = json.load(handle)
    if "name" not in config:
        raise KeyError("the config has no name")
    config.setdefault("retries", 3)
    config.setdefault("timeout", 30)
    return config
''',
    '''def fibonacci(n):
    if n < 0:
        raise ValueError("n must be non-negative")
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def fibonacci_list(count):
    return [fibonacci(i) for i in range(count)]
''',
]
CODE_CHANGES = [
    "renaming the function merge_sorted to merge_lists",
    "renaming the method total to count_all",
    "changing the default timeout from 30 to 60",
    "renaming the function fibonacci_list to first_fibonacci_numbers",
]
PASSAGES = [
    (
        "river",
        "The town grew up around a market square. The river runs along its eastern edge "
        "and floods every few winters. Most houses are built of grey stone from the hills. "
        "Fishermen still sell their catch from the river at dawn. A railway line reached "
        "the town in 1871. The old mill stands where the river bends to the south.",
    ),
    (
        "battery",
        "The phone weighs 180 grams and has a six inch screen. Its battery lasts about two "
        "days with light use. The camera takes sharp photos in daylight. Charging the "
        "battery from empty takes just under an hour. The case is made of recycled "
        "aluminium. A smaller battery is used in the cheaper model.",
    ),
]


def workload_messages() -> list[list[dict[str, str]]]:
    """Chat prompts whose answers copy from the prompt."""
    conversations = []
    for code, change in zip(CODE_SNIPPETS, CODE_CHANGES, strict=True):
        text = f"Rewrite this Python code, {change}. Output only the code.\n\n{code}"
        conversations.append([{"role": "user", "content": text}])
    for word, passage in PASSAGES:
        text = (
            f"Quote, word for word, every sentence of this text that mentions the {word}.\n\n"
            f"{passage}"
        )
        conversations.append([{"role": "user", "content": text}])
    return conversations


def spec_config(method: str, args: Any, policy: bool = True) -> dict[str, Any]:
    """The speculative_config of a `--methods` entry."""
    config: dict[str, Any] = {"num_speculative_tokens": args.k}
    if method == "ngram":
        config.update(method="ngram", prompt_lookup_min=args.lookup_min,
                      prompt_lookup_max=args.lookup_max)
    elif method.startswith("draft:"):
        config.update(method="draft_model", model=method.split(":", 1)[1])
    elif method.startswith("draft-layers:"):
        config.update(method="draft_model",
                      model=truncated_draft(args, int(method.split(":", 1)[1])))
    elif method in ("eagle", "eagle3", "medusa"):
        config.update(method=method, model=random_head(args, method))
        config["num_speculative_tokens"] = min(args.k, 3)
    else:
        raise SystemExit(f"unknown method {method!r}")
    if not policy:
        config["disable_by_batch_size"] = 10_000
    return config


def _target_config(args: Any) -> Any:
    from pagedllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=args.model).create_engine_config().model_config


def truncated_draft(args: Any, num_layers: int) -> str:
    """The target's first `num_layers` layers, norm and LM head as a safetensors folder."""
    import shutil

    folder = Path(args.work_dir) / f"draft_{num_layers}_layers"
    if (folder / "config.json").is_file():
        return str(folder)
    from transformers import AutoModelForCausalLM

    config = _target_config(args)
    model = AutoModelForCausalLM.from_pretrained(
        config.model_dir, gguf_file=config.gguf_file, dtype="float32"
    )
    from safetensors.torch import save_file

    model.model.layers = model.model.layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    # transformers will not re-save a GGUF-loaded model: write its tensors and config.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        source = Path(config.model_dir) / name
        if source.is_file():
            shutil.copy(source, folder / name)
    tokenizer = _load_target_tokenizer(config)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _load_target_tokenizer(config: Any) -> Any:
    from pagedllm.tokenizer.tokenizer import get_tokenizer

    return get_tokenizer(config.model_dir, config.gguf_file)


def random_head(args: Any, method: str) -> str:
    """Random EAGLE / EAGLE-3 / Medusa weights sized for the target (overhead only)."""
    import json

    import torch
    from safetensors.torch import save_file

    folder = Path(args.work_dir) / f"random_{method}"
    if (folder / "config.json").is_file():
        return str(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = _target_config(args).hf_config
    hidden, vocab = hf.hidden_size, hf.vocab_size
    heads, kv_heads = hf.num_attention_heads, hf.num_key_value_heads
    head_dim, inter = hidden // heads, hf.intermediate_size
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    if method == "medusa":
        tensors = {}
        for head in range(3):
            tensors[f"{head}.0.linear.weight"] = rand(hidden, hidden)
            tensors[f"{head}.0.linear.bias"] = rand(hidden)
            tensors[f"{head}.1.weight"] = rand(vocab, hidden)
        config = {"medusa_num_heads": 3, "medusa_num_layers": 1}
    else:
        prefix = "midlayer" if method == "eagle3" else "layers.0"
        q_in = 2 * hidden if method == "eagle3" else hidden
        tensors = {
            f"{prefix}.self_attn.q_proj.weight": rand(heads * head_dim, q_in),
            f"{prefix}.self_attn.k_proj.weight": rand(kv_heads * head_dim, q_in),
            f"{prefix}.self_attn.v_proj.weight": rand(kv_heads * head_dim, q_in),
            f"{prefix}.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            f"{prefix}.mlp.gate_proj.weight": rand(inter, hidden),
            f"{prefix}.mlp.up_proj.weight": rand(inter, hidden),
            f"{prefix}.mlp.down_proj.weight": rand(hidden, inter),
            f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
        }
        config = {k: getattr(hf, k) for k in (
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "max_position_embeddings", "rms_norm_eps")}
        config["rope_theta"] = getattr(hf, "rope_theta", None) or 100_000.0
        config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
        if method == "eagle3":
            draft_vocab = 32_000
            tensors.update({
                "fc.weight": rand(hidden, 3 * hidden),
                "midlayer.input_layernorm.weight": torch.ones(hidden),
                "midlayer.hidden_norm.weight": torch.ones(hidden),
                "norm.weight": torch.ones(hidden),
                "lm_head.weight": rand(draft_vocab, hidden),
                "d2t": torch.zeros(draft_vocab, dtype=torch.int64),
            })
            config.update(architectures=["LlamaForCausalLMEagle3"],
                          draft_vocab_size=draft_vocab)
        else:
            tensors.update({"fc.weight": rand(hidden, 2 * hidden), "fc.bias": rand(hidden)})
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def make_engine(args: Any, speculative_config: dict[str, Any] | None) -> Any:
    from pagedllm.engine.arg_utils import EngineArgs
    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(EngineArgs(
        model=args.model, enable_prefix_caching=False, speculative_config=speculative_config,
        max_num_seqs=max(args.batch_size, 1),
    ))


def prompt_ids(engine: Any, conversations: list[list[dict[str, str]]]) -> list[list[int]]:
    from pagedllm.tokenizer.tokenizer import apply_chat_template

    tokenizer = engine.get_tokenizer()
    return [
        tokenizer.encode(apply_chat_template(tokenizer, c, add_generation_prompt=True),
                         add_special_tokens=False)
        for c in conversations
    ]


def run_one(engine: Any, prompt: list[int], output_len: int, request_id: str) -> dict[str, Any]:
    """One request alone: its tokens and decode timing."""
    from pagedllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len)
    start = time.perf_counter()
    engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    first = end = None
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens = list(output.outputs[0].token_ids)
            if first is None and tokens:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return {"tokens": tokens, "ttft": first - start, "decode_s": end - first}


def single_stream(engine: Any, prompts: list[list[int]], args: Any, tag: str) -> dict[str, Any]:
    """Every prompt alone, `--num-iters` times; the median pass's decode tok/s."""
    run_one(engine, prompts[0], 16, f"{tag}-warmup")
    passes = []
    outputs: list[list[int]] = []
    for iteration in range(args.num_iters):
        results = [run_one(engine, p, args.output_len, f"{tag}-{iteration}-{i}")
                   for i, p in enumerate(prompts)]
        outputs = [r["tokens"] for r in results]
        decode_tokens = sum(len(r["tokens"]) - 1 for r in results)
        decode_s = sum(r["decode_s"] for r in results)
        passes.append(decode_tokens / decode_s)
    return {"decode_tokens_per_s": statistics.median(passes), "passes": passes,
            "outputs": outputs}


def batch_pass(engine: Any, prompts: list[list[int]], args: Any, tag: str) -> dict[str, Any]:
    """`--batch-size` requests at once (the prompts repeated); output tok/s."""
    from pagedllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.output_len)
    batch = [prompts[i % len(prompts)] for i in range(args.batch_size)]
    rates = []
    outputs: dict[str, list[int]] = {}
    for iteration in range(args.num_iters):
        start = time.perf_counter()
        for i, prompt in enumerate(batch):
            engine.add_request(f"{tag}-b{iteration}-{i}", {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    outputs[output.request_id.split("-")[-1]] = list(output.outputs[0].token_ids)
        elapsed = time.perf_counter() - start
        rates.append(sum(len(t) for t in outputs.values()) / elapsed)
    ordered = [outputs[str(i)] for i in range(len(batch))]
    return {"output_tokens_per_s": statistics.median(rates), "passes": rates, "outputs": ordered}


def agreement(got: list[list[int]], want: list[list[int]]) -> dict[str, Any]:
    """How many outputs are identical, and the share of tokens before the first divergence
    (bfloat16 steps of different sizes may take different matmul paths)."""
    same_prefix = 0
    for g, w in zip(got, want, strict=True):
        n = 0
        while n < min(len(g), len(w)) and g[n] == w[n]:
            n += 1
        same_prefix += n
    return {
        "identical_outputs": sum(g == w for g, w in zip(got, want, strict=True)),
        "outputs": len(want),
        "tokens_before_divergence": same_prefix / max(1, sum(len(w) for w in want)),
    }


def acceptance(engine: Any) -> dict[str, Any]:
    metrics = {m.name.split(":")[-1]: m for m in engine.get_metrics()}
    drafts = metrics["spec_decode_num_drafts"].value
    accepted = metrics["spec_decode_num_accepted_tokens"].value
    return {
        "drafts": drafts,
        "draft_tokens": metrics["spec_decode_num_draft_tokens"].value,
        "accepted_tokens": accepted,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 0.0,
        "accepted_per_pos": metrics["spec_decode_num_accepted_tokens_per_pos"].values,
    }


def main() -> None:
    parser = new_parser(__doc__)
    parser.add_argument("--model", default=None, help="Target model (default: the default).")
    parser.add_argument("--methods", default="ngram")
    parser.add_argument("--k", type=int, default=5, help="num_speculative_tokens")
    parser.add_argument("--lookup-min", type=int, default=2)
    parser.add_argument("--lookup-max", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--no-policy-run", action="store_true")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--work-dir", default=str(Path.home() / ".cache" / "pagedllm-bench"),
                        help="Where generated drafts and random heads are kept.")
    args = parser.parse_args()

    conversations = workload_messages()
    baseline = make_engine(args, None)
    prompts = prompt_ids(baseline, conversations)
    results: dict[str, Any] = {"machine": machine_info(), "args": vars(args)}
    base_single = single_stream(baseline, prompts, args, "base")
    base_batch = batch_pass(baseline, prompts, args, "base")
    results["none"] = {"single": _strip(base_single), "batch": _strip(base_batch)}
    print(f"no speculation: single-stream decode {base_single['decode_tokens_per_s']:.1f} tok/s"
          f", batch {args.batch_size}: {base_batch['output_tokens_per_s']:.1f} tok/s")
    del baseline
    for method in args.methods.split(","):
        engine = make_engine(args, spec_config(method, args))
        single = single_stream(engine, prompts, args, "spec")
        same = single["outputs"] == base_single["outputs"]
        single_stats = acceptance(engine)
        batch = batch_pass(engine, prompts, args, "spec")
        entry: dict[str, Any] = {
            "config": spec_config(method, args),
            "single": _strip(single), "single_acceptance": single_stats,
            "single_ratio": single["decode_tokens_per_s"] / base_single["decode_tokens_per_s"],
            "single_same_outputs": same,
            "batch": _strip(batch),
            "batch_ratio": batch["output_tokens_per_s"] / base_batch["output_tokens_per_s"],
            "batch_same_outputs": batch["outputs"] == base_batch["outputs"],
            "batch_agreement": agreement(batch["outputs"], base_batch["outputs"]),
        }
        print(f"{method}: single-stream decode {single['decode_tokens_per_s']:.1f} tok/s "
              f"= {entry['single_ratio']:.2f}x (same outputs: {same}); mean acceptance length "
              f"{single_stats['mean_acceptance_length']:.2f}, accepted "
              f"{single_stats['accepted_tokens']}/{single_stats['draft_tokens']}")
        print(f"{method}: batch {args.batch_size} (policy on) {batch['output_tokens_per_s']:.1f}"
              f" tok/s = {entry['batch_ratio']:.3f}x (identical outputs: "
              f"{entry['batch_agreement']['identical_outputs']}/{args.batch_size}, tokens "
              f"before a divergence: {entry['batch_agreement']['tokens_before_divergence']:.1%})")
        del engine
        if not args.no_policy_run:
            engine = make_engine(args, spec_config(method, args, policy=False))
            forced = batch_pass(engine, prompts, args, "forced")
            entry["batch_policy_off"] = _strip(forced)
            entry["batch_policy_off_ratio"] = (
                forced["output_tokens_per_s"] / base_batch["output_tokens_per_s"]
            )
            entry["batch_policy_off_acceptance"] = acceptance(engine)
            print(f"{method}: batch {args.batch_size} (policy off) "
                  f"{forced['output_tokens_per_s']:.1f} tok/s = "
                  f"{entry['batch_policy_off_ratio']:.3f}x")
            del engine
        results[method] = entry
    if args.output_json:
        write_json(args.output_json, results)


def _strip(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "outputs"}


if __name__ == "__main__":
    main()
