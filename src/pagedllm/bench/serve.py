"""`pagedllm bench serve`: drive a running OpenAI-compatible server (vLLM's `bench serve`).

`--num-prompts` streaming completions of `--input-len` (random tokens) or about that many
words (`--dataset-name words`, for a server whose vocabulary is unknown), `--output-len`
tokens each (ignore_eos), started at `--request-rate` per second (Poisson; inf: all at
once) with at most `--max-concurrency` in flight. Token counts come from the server's usage.
Prints vLLM's result block: throughput, TTFT, TPOT, ITL and end-to-end latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import httpx
from tqdm import tqdm

from pagedllm.bench.prompts import random_text_prompts, random_token_prompts
from pagedllm.bench.serve_client import print_summary, run_workload, summarize_run


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """The flags of `bench serve` (vLLM's names)."""
    parser.add_argument("--base-url", default=None, help="server URL (default: from --host "
                        "and --port)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--endpoint", default="/v1/completions")
    parser.add_argument("--model", default=None, help="model name (default: the server's "
                        "first in /v1/models)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--dataset-name", choices=("random", "words"), default="random",
                        help="random: token ids below --vocab-size; words: English words")
    parser.add_argument("--vocab-size", type=int, default=None, help="for random prompts "
                        "(default: the tokenizer of --tokenizer, else 'words')")
    parser.add_argument("--tokenizer", default=None, help="a model path whose tokenizer sets "
                        "the vocabulary size of random prompts")
    parser.add_argument("--input-len", "--random-input-len", dest="input_len", type=int,
                        default=128)
    parser.add_argument("--output-len", "--random-output-len", dest="output_len", type=int,
                        default=128)
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--output-json", default=None)


def _base_url(args: argparse.Namespace) -> str:
    return (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")


def _model(args: argparse.Namespace, base_url: str) -> str:
    if args.model:
        return str(args.model)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    response = httpx.get(base_url + "/v1/models", headers=headers, timeout=30)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def _vocab_size(args: argparse.Namespace) -> int | None:
    if args.vocab_size:
        return int(args.vocab_size)
    if args.tokenizer:
        from pagedllm.model_loader.source import resolve_model_source
        from pagedllm.tokenizer.tokenizer import get_tokenizer

        return len(get_tokenizer(*resolve_model_source(args.tokenizer)))
    return None


def _prompts(args: argparse.Namespace) -> list[Any]:
    vocab = _vocab_size(args) if args.dataset_name == "random" else None
    if vocab is None:
        return list(random_text_prompts(args.num_prompts, args.input_len, args.seed))
    return list(random_token_prompts(args.num_prompts, args.input_len, vocab, args.seed))


def run_serve(args: argparse.Namespace) -> dict[str, Any]:
    """Run the workload against the server and print the summary."""
    base_url = _base_url(args)
    model = _model(args, base_url)
    payloads = [{"model": model, "prompt": prompt, "max_tokens": args.output_len,
                 "ignore_eos": True, "temperature": 0.0, "stream": True,
                 "stream_options": {"include_usage": True}} for prompt in _prompts(args)]
    with tqdm(total=len(payloads), desc="Requests") as bar:
        results, duration = asyncio.run(run_workload(
            base_url + args.endpoint, payloads, request_rate=args.request_rate,
            max_concurrency=args.max_concurrency, api_key=args.api_key, seed=args.seed,
            request_timeout=args.request_timeout, on_done=lambda _: bar.update(1)))
    summary = summarize_run(results, duration)
    print_summary(model, summary)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary
