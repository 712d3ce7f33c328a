"""Structured outputs: what a JSON-schema constraint costs, on the same requests, same run.

N chat requests (default 64) ask the model for a JSON record, each under one of four
schemas (person, product, event, weather report: objects, enums, bounded integers, arrays,
nested objects, booleans). The constrained pass runs them greedy with
`structured_outputs=StructuredOutputsParams(json=schema)`, `--batch-size` at a time
(max_num_seqs). The unconstrained pass runs the same prompts with each request's output
length fixed to what its constrained run produced (ignore_eos), so both passes generate the
same number of tokens per request in the same batches: the difference is the grammar's cost
(bitmask filling, matcher updates, full logits for constrained rows). Passes alternate,
`--num-iters` times each, after an untimed warm-up that also compiles the four grammars.

Grammar compile time is measured apart: "cold" compiles each schema with the backend (no
cache) and fills a first bitmask from a fresh matcher (llguidance builds its parser lazily,
so the first mask is part of its cost), "cached" asks the engine's manager again for a
grammar it already holds. `--backend guidance` runs everything with llguidance.

    python benchmarks/structured.py                                  # 64 requests, batch 32
    python benchmarks/structured.py --num-iters 3 --output-json benchmarks/results/structured.json
    python benchmarks/structured.py --backend guidance
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from common import (
    add_model_arg,
    load_average,
    locate_model,
    machine_info,
    new_parser,
    summarize,
    write_json,
)

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,15}( [A-Z][a-z]{1,15})?$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "enum": ["Paris", "London", "Tokyo", "Lima", "Oslo"]},
            "skills": {"type": "array", "maxItems": 3,
                       "items": {"enum": ["python", "cooking", "chess", "music", "math"]}},
        },
        "required": ["name", "age", "city", "skills"],
        "additionalProperties": False,
    },
    "product": {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "price": {"type": "number", "minimum": 0, "maximum": 10000},
            "in_stock": {"type": "boolean"},
            "category": {"enum": ["books", "toys", "garden", "tools"]},
        },
        "required": ["sku", "price", "in_stock", "category"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "pattern": "^[A-Za-z ]{3,40}$"},
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
            "month": {"enum": ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug",
                               "Sep", "Oct", "Nov", "Dec"]},
            "venue": {"type": "object",
                      "properties": {"hall": {"type": "string", "pattern": "^[A-Z]$"},
                                     "seats": {"type": "integer", "minimum": 1,
                                               "maximum": 5000}},
                      "required": ["hall", "seats"], "additionalProperties": False},
        },
        "required": ["title", "day", "month", "venue"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Z][a-z]{2,15}$"},
            "temperature_c": {"type": "integer", "minimum": -50, "maximum": 60},
            "sky": {"anyOf": [{"enum": ["clear", "cloudy", "rain", "snow"]},
                              {"type": "null"}]},
            "wind_kmh": {"type": "array", "minItems": 1, "maxItems": 4,
                         "items": {"type": "integer", "minimum": 0, "maximum": 200}},
        },
        "required": ["city", "temperature_c", "sky", "wind_kmh"],
        "additionalProperties": False,
    },
}
ASKS = {
    "person": "Invent a person (number {i}) and describe them as JSON with name, age, city "
              "and skills.",
    "product": "Invent product number {i} of a shop and give it as JSON with sku, price, "
               "in_stock and category.",
    "event": "Invent event number {i} of a concert hall as JSON with title, day, month and "
             "venue.",
    "weather": "Give weather report number {i} for a European city as JSON with city, "
               "temperature_c, sky and wind_kmh.",
}


def make_requests(tokenizer: Any, num: int) -> list[tuple[str, list[int]]]:
    """(schema name, chat prompt token ids) for `num` requests, schemas in turn."""
    names = list(SCHEMAS)
    requests = []
    for i in range(num):
        name = names[i % len(names)]
        messages = [{"role": "user", "content": ASKS[name].format(i=i)}]
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
        requests.append((name, tokenizer.encode(text, add_special_tokens=False)))
    return requests


def run_pass(llm: Any, requests: list[tuple[str, list[int]]], params: list[Any]
             ) -> dict[str, Any]:
    """Generate every request (the engine batches them); time it, return the outputs."""
    prompts = [{"prompt_token_ids": ids} for _, ids in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    seqs = [out.outputs[0] for out in outputs]
    num_output = sum(len(seq.token_ids) for seq in seqs)
    return {
        "elapsed_s": elapsed,
        "output_tokens": num_output,
        "output_tokens_per_s": num_output / elapsed,
        "texts": [seq.text for seq in seqs],
        "lengths": [len(seq.token_ids) for seq in seqs],
        "finish_reasons": [seq.finish_reason for seq in seqs],
    }


def validity(requests: list[tuple[str, list[int]]], texts: list[str]) -> dict[str, int]:
    """How many outputs parse as JSON and validate against their schema."""
    try:
        import jsonschema
    except ImportError:  # the test extra has it; without it only parsing is checked
        jsonschema = None
    parsed = valid = 0
    for (name, _), text in zip(requests, texts, strict=True):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        parsed += 1
        if jsonschema is None:
            continue
        try:
            jsonschema.validate(value, SCHEMAS[name])
            valid += 1
        except jsonschema.ValidationError:
            pass
    return {"parsed": parsed, "valid": valid if jsonschema else -1, "total": len(texts)}


def compile_times(llm: Any, repeats: int) -> dict[str, Any]:
    """Cold compile of each schema with the backend (to a first bitmask), and the manager's
    cached answer."""
    from pagedllm import StructuredOutputsParams

    manager = llm.llm_engine.engine_core.engine_core.structured_output
    backend = manager._get_backend()
    bitmask = backend.allocate_bitmask(1)
    stops = [llm.get_tokenizer().eos_token_id]
    cold: dict[str, list[float]] = {name: [] for name in SCHEMAS}
    cached: list[float] = []
    for _ in range(repeats):
        for name, schema in SCHEMAS.items():
            params = StructuredOutputsParams(json=schema)
            start = time.perf_counter()
            backend.matcher(backend.compile(params), stops).fill_bitmask(bitmask, 0)
            cold[name].append(time.perf_counter() - start)
            assert manager.grammar_for(params, [0]).matcher is not None  # into the cache
            start = time.perf_counter()
            matcher = manager.grammar_for(params, [0]).matcher
            cached.append(time.perf_counter() - start)
            assert matcher is not None
    return {
        "cold_ms": {name: 1000 * statistics.median(times) for name, times in cold.items()},
        "cached_ms_median": 1000 * statistics.median(cached),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    p = new_parser(__doc__)
    add_model_arg(p)
    p.add_argument("--num-requests", type=int, default=64, help="requests per pass")
    p.add_argument("--batch-size", type=int, default=32, help="engine max_num_seqs")
    p.add_argument("--max-tokens", type=int, default=160, help="output cap per request")
    p.add_argument("--num-iters", type=int, default=3, help="timed passes of each kind")
    p.add_argument("--compile-repeats", type=int, default=3, help="cold compiles per schema")
    p.add_argument("--seed", type=int, default=0, help="engine seed")
    p.add_argument("--backend", default="auto", choices=("auto", "xgrammar", "guidance"),
                   help="structured_outputs_config backend")
    p.add_argument("--output-json", default=None, metavar="PATH", help="write results here")
    return p


def main(argv: list[str] | None = None) -> None:
    """Measure both passes and the compile times, print the report, write the JSON."""
    from pagedllm import LLM, SamplingParams, StructuredOutputsParams

    args = build_parser().parse_args(argv)
    location = locate_model(args.model)
    start = time.perf_counter()
    llm = LLM(location.path, max_num_seqs=args.batch_size, seed=args.seed,
              structured_outputs_config={"backend": args.backend})
    print(f"model {location.path} loaded in {time.perf_counter() - start:.1f} s; "
          f"{args.num_requests} requests, batch {args.batch_size}, backend {args.backend}")
    requests = make_requests(llm.get_tokenizer(), args.num_requests)
    constrained = [
        SamplingParams(temperature=0.0, max_tokens=args.max_tokens,
                       structured_outputs=StructuredOutputsParams(json=SCHEMAS[name]))
        for name, _ in requests
    ]
    warmup = run_pass(llm, requests, constrained)  # compiles the grammars, warms the kernels
    free = [SamplingParams(temperature=0.0, max_tokens=length, ignore_eos=True)
            for length in warmup["lengths"]]
    runs: dict[str, list[dict[str, Any]]] = {"constrained": [], "unconstrained": []}
    for i in range(args.num_iters):
        for label, params in (("constrained", constrained), ("unconstrained", free)):
            run = run_pass(llm, requests, params)
            runs[label].append(run)
            print(f"  iter {i + 1}/{args.num_iters} {label:<13} {run['elapsed_s']:6.2f} s "
                  f"{run['output_tokens_per_s']:7.1f} output tok/s", flush=True)
    check = validity(requests, runs["constrained"][-1]["texts"])
    assert runs["unconstrained"][-1]["lengths"] == warmup["lengths"], "unequal work"
    compiles = compile_times(llm, args.compile_repeats)
    summary = {label: summarize([r["elapsed_s"] for r in passes])
               for label, passes in runs.items()}
    overhead = summary["constrained"]["median"] / summary["unconstrained"]["median"] - 1
    lengths = warmup["lengths"]
    print(f"\noutput tokens per request: mean {statistics.fmean(lengths):.1f}, "
          f"max {max(lengths)}; finish reasons "
          f"{ {r: warmup['finish_reasons'].count(r) for r in set(warmup['finish_reasons'])} }")
    print(f"constrained outputs: {check['parsed']}/{check['total']} parse, "
          f"{check['valid']}/{check['total']} validate against their schema")
    for label in runs:
        tps = [r["output_tokens_per_s"] for r in runs[label]]
        print(f"{label:<13} median {summary[label]['median']:.2f} s, "
              f"{statistics.median(tps):.1f} output tok/s")
    print(f"throughput overhead of the constraint: {overhead:+.1%} (target <= +10%)")
    print("grammar compile, cold: " + ", ".join(
        f"{name} {ms:.1f} ms" for name, ms in compiles["cold_ms"].items())
        + f"; cached: {compiles['cached_ms_median']:.3f} ms")
    if args.output_json:
        machine = machine_info()
        machine["loadavg_end"] = load_average()
        for passes in runs.values():
            for run in passes:
                run.pop("texts")
        write_json(args.output_json, {
            "benchmark": "structured", "config": vars(args) | {"model": location.path},
            "machine": machine, "summary": summary, "overhead": overhead,
            "validity": check, "compile": compiles, "runs": runs,
            "example_output": warmup["texts"][:4],
        })
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
