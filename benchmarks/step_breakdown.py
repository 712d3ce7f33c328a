"""Where an engine step's time goes, under the offline throughput load.

Runs the offline workload of `throughput.py` (default: 64 prompts of 100-300 tokens, 128
greedy output tokens each, EOS ignored) through `LLMEngine.step()` and times each phase of
every step by wrapping the engine's methods (the engine itself is unchanged):

- schedule: `Scheduler.schedule` (which requests run, KV blocks);
- input preparation: the runner's state update and input arrays, the attention metadata;
- forward: the model's decoder (embedding, layers, final norm);
- logits: the LM head on the sampled positions;
- sampling: the sampler and the runner's output (token ids to lists);
- scheduler update: `Scheduler.update_from_output` and the step's stats;
- output processing: detokenization and `RequestOutput`s (`OutputProcessor`).

Model execution is forward + logits + sampling; the rest is engine overhead. Reported per
phase: total seconds and share of the summed step wall time, for `--num-iters` passes after
a warm-up, median and range.

`--single-stream` times the decode steps of one request instead, taking its output at its
end as `LLM.generate` does (the engine then groups decode steps by default: multi-step
scheduling) and then as a stream (one step at a time): each step's wall time
split into the time inside the C kernels (every call into the kernel library: the decode
stack, the LM head's matmul, ...) and the time outside them (scheduler, input preparation,
torch ops, sampling, output processing, Python), median over the steps. A last pass with
the phases timed as above then splits the outside time by phase (median µs a step; the
model's phases less the kernels' time in them). The phase timers' own wrappers cost about a
microsecond a call, so that pass runs after the measured ones.

    python benchmarks/step_breakdown.py
    python benchmarks/step_breakdown.py --num-prompts 16 --output-len 32 --output-json out.json
    python benchmarks/step_breakdown.py --single-stream --output-len 256
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from common import (
    add_scheduler_steps_arg,
    format_stat,
    load_average,
    load_tokenizer,
    locate_model,
    machine_info,
    make_prompts,
    prompts_summary,
    summarize,
    write_json,
)

PHASES = (
    "schedule",
    "input preparation",
    "forward",
    "logits",
    "sampling",
    "scheduler update",
    "output processing",
)
MODEL_EXECUTION = ("forward", "logits", "sampling")


class PhaseTimer:
    """Accumulates wall time per phase; nested phases are subtracted from their parents."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        # Per step (single-stream passes): (wall s, s inside kernels, phase totals).
        self.steps: list[tuple[float, float, dict[str, float]]] = []
        self._wrapped: list[tuple[Any, str, Any]] = []  # (owner, method, original)
        self._stack: list[list[float]] = []  # per open phase: [time spent in children]

    def wrap(self, owner: Any, method: str, phase: str | None) -> None:
        """Time `owner.method` as `phase` (None: only subtract it from its parent)."""
        original = getattr(owner, method)
        # What the owner itself held (None: it inherited the method or, an instance, read
        # it from its class): put back, or the wrapper deleted, by uninstall.
        self._wrapped.append((owner, method, vars(owner).get(method)))
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            timer._stack.append([0.0])
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                children = timer._stack.pop()[0]
                if phase is not None:
                    timer.totals[phase] += elapsed - children
                if timer._stack:
                    timer._stack[-1][0] += elapsed if phase is not None else elapsed - children

        setattr(owner, method, timed)

    def uninstall(self) -> None:
        """Put every wrapped method back (classes are shared with the rest of the process)."""
        for owner, method, original in reversed(self._wrapped):
            if original is None:
                delattr(owner, method)
            else:
                setattr(owner, method, original)
        self._wrapped.clear()


def instrument(llm: Any, timer: PhaseTimer) -> Callable[[], Any]:
    """Wrap the engine's phases; return the timed `step` function."""
    from pagedllm.core.scheduler import Scheduler
    from pagedllm.engine.output_processor import OutputProcessor
    from pagedllm.worker.model_runner import ModelRunner
    from pagedllm.worker.multi_step import GreedyDecodeLoop
    from pagedllm.worker.sampling import SamplingPipeline

    core = llm.llm_engine.engine_core.engine_core
    runner = core.executor.worker.model_runner
    timer.wrap(Scheduler, "schedule", "schedule")
    timer.wrap(Scheduler, "update_from_output", "scheduler update")
    timer.wrap(Scheduler, "make_stats", "scheduler update")
    for name in ("_update_states", "_prepare_inputs", "_decode_batch", "_common_metadata"):
        timer.wrap(ModelRunner, name, "input preparation")
    timer.wrap(runner.backend, "build_metadata", "input preparation")
    timer.wrap(runner.model, "forward", "forward")
    if runner.decode_step is not None:  # the one-call decode stack runs decode and mixed steps
        timer.wrap(runner.decode_step, "run", "forward")
    timer.wrap(runner.model, "compute_logits", "logits")
    timer.wrap(SamplingPipeline, "sample", "sampling")  # (its LM head is subtracted)
    timer.wrap(ModelRunner, "_append_sampled", "sampling")
    # A multi-step's greedy loop: its forwards and argmaxes (worker/multi_step.py).
    timer.wrap(GreedyDecodeLoop, "run", "sampling")
    timer.wrap(OutputProcessor, "process_outputs", "output processing")
    return llm.llm_engine.step


class KernelClock:
    """Time spent inside the kernel library's C functions (every declared one, wrapped on
    the loaded library object, which every caller looks its functions up on)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._originals: dict[str, Any] = {}
        self._lib: Any = None

    def install(self) -> bool:
        """Wrap the functions; False when no kernel library is loaded here."""
        from pagedllm.kernels.abi import FUNCTIONS
        from pagedllm.platform import cpu_platform

        library = cpu_platform().kernel_library()
        if library is None:
            return False
        self._lib = library.lib
        for function in FUNCTIONS:
            original = getattr(self._lib, function.name)
            self._originals[function.name] = original
            setattr(self._lib, function.name, self._timed(original))
        return True

    def uninstall(self) -> None:
        """Put the library's own functions back."""
        for name, original in self._originals.items():
            setattr(self._lib, name, original)
        self._originals.clear()

    def _timed(self, function: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                clock.seconds += time.perf_counter() - start

        return timed


def single_stream_pass(llm: Any, clock: KernelClock, prompt: list[int], output_len: int,
                       timer: PhaseTimer | None = None, final_only: bool = True
                       ) -> list[tuple[float, float]]:
    """One request's decode steps after its prefill: (wall s, s inside kernels) each; with
    a `timer` (its wrappers installed), each engine step's phase totals are kept in
    `timer.steps`, per decode step. An engine step of several decode steps (multi-step
    scheduling: it returns that many tokens) counts as that many steps of its mean time.
    `final_only`: the request takes its final output alone, as `LLM.generate`'s do (the
    engine may then group decode steps); else its output after every step, as a stream."""
    from pagedllm import SamplingParams
    from pagedllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    kind = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.CUMULATIVE
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_len,
                            output_kind=kind)
    request_id = f"ss-{time.monotonic_ns()}"
    engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    # The engine core's own request (in this process): its token count after each step.
    request = engine.engine_core.engine_core.scheduler.requests[request_id]
    steps: list[tuple[float, float]] = []
    num_tokens, prefilled = 0, False
    while engine.has_unfinished_requests():
        clock.seconds = 0.0
        if timer is not None:
            timer.totals.clear()
        start = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - start
        total = request.num_output_tokens
        new, num_tokens = total - num_tokens, total
        if not prefilled:  # the first step is the prefill (and its first token)
            prefilled = True
            continue
        share = 1 / max(1, new)
        steps += [(wall * share, clock.seconds * share)] * max(1, new)
        if timer is not None:
            totals = {phase: t * share for phase, t in timer.totals.items()}
            timer.steps += [(wall * share, clock.seconds * share, totals)] * max(1, new)
    return steps


def outside_by_phase(steps: list[tuple[float, float, dict[str, float]]]) -> dict[str, float]:
    """Median seconds a step outside the kernels, per phase: the model's phases (forward,
    logits, sampling) together less the kernels' time, every other phase as timed, and
    what no phase covers (the engine's own step code)."""
    rows: dict[str, list[float]] = defaultdict(list)
    for wall, kernels, totals in steps:
        model = sum(totals.get(phase, 0.0) for phase in MODEL_EXECUTION)
        rows["model, outside kernels"].append(model - kernels)
        for phase in PHASES:
            if phase not in MODEL_EXECUTION:
                rows[phase].append(totals.get(phase, 0.0))
        rows["other"].append(wall - sum(totals.get(phase, 0.0) for phase in PHASES))
    return {name: statistics.median(values) for name, values in rows.items()}


def report_single_stream(llm: Any, prompt: list[int], output_len: int, num_iters: int
                         ) -> dict[str, Any]:
    """Print and return the decode steps' median wall, kernel and outside times (the
    kernel library's own functions put back afterwards: it is the whole process's)."""
    clock = KernelClock()
    if not clock.install():
        raise SystemExit("No kernel library here: nothing runs in C kernels.")
    try:
        return _single_stream_report(llm, clock, prompt, output_len, num_iters)
    finally:
        clock.uninstall()


# The two ways a request takes its output: at its end (LLM.generate, a server request
# without `stream`) or after every step (a stream); the engine groups decode steps by
# default only for the first (core/multi_step.py).
STREAM_KINDS = {"final output only (LLM.generate)": True, "streamed": False}


def _single_stream_report(llm: Any, clock: KernelClock, prompt: list[int], output_len: int,
                          num_iters: int) -> dict[str, Any]:
    """report_single_stream's passes and printout, with `clock` installed: one block per
    way of taking the output."""
    return {name: _single_stream_kind(llm, clock, prompt, output_len, num_iters, name, final)
            for name, final in STREAM_KINDS.items()}


def _single_stream_kind(llm: Any, clock: KernelClock, prompt: list[int], output_len: int,
                        num_iters: int, name: str, final_only: bool) -> dict[str, Any]:
    """The passes and printout for one way of taking the output."""
    single_stream_pass(llm, clock, prompt, 16, final_only=final_only)  # warm-up
    steps = []
    for _ in range(num_iters):
        llm.reset_prefix_cache()
        steps += single_stream_pass(llm, clock, prompt, output_len, final_only=final_only)
    wall = statistics.median(w for w, _ in steps)
    kernels = statistics.median(k for _, k in steps)
    outside = statistics.median(w - k for w, k in steps)
    print(f"single stream, {name}, {len(prompt)}-token prompt, {len(steps)} decode steps:")
    print(f"  step {wall * 1e3:.3f} ms (median)   in kernels {kernels * 1e3:.3f} ms   "
          f"outside {outside * 1e3:.3f} ms = {outside / wall * 100:.1f}% of the step")
    # The outside time by phase, in a pass of its own (the phase wrappers cost time).
    timer = PhaseTimer()
    instrument(llm, timer)
    try:
        llm.reset_prefix_cache()
        single_stream_pass(llm, clock, prompt, output_len, timer, final_only=final_only)
    finally:
        timer.uninstall()
    phases = outside_by_phase(timer.steps)
    print("  outside the kernels by phase (median µs a step, a pass with phase timers):")
    for phase, seconds in phases.items():
        print(f"    {phase:<24} {seconds * 1e6:8.1f}")
    return {"steps": len(steps), "step_ms": wall * 1e3, "kernel_ms": kernels * 1e3,
            "outside_ms": outside * 1e3, "outside_share": outside / wall,
            "outside_by_phase_us": {phase: s * 1e6 for phase, s in phases.items()}}


def timed_pass(
    llm: Any, step: Callable[[], Any], timer: PhaseTimer, prompts: list[list[int]], output_len: int
) -> dict[str, Any]:
    """One pass over all prompts with every phase timed; shares of the step wall time."""
    from pagedllm import SamplingParams

    timer.totals.clear()
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_len)
    for i, ids in enumerate(prompts):
        engine.add_request(f"bd-{time.monotonic_ns()}-{i}", {"prompt_token_ids": ids}, params)
    step_wall, num_steps = 0.0, 0
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        step()
        step_wall += time.perf_counter() - start
        num_steps += 1
    totals = {phase: timer.totals.get(phase, 0.0) for phase in PHASES}
    totals["other"] = step_wall - sum(totals.values())
    model = sum(totals[p] for p in MODEL_EXECUTION)
    return {
        "step_wall_s": step_wall,
        "num_steps": num_steps,
        "seconds": totals,
        "share": {phase: t / step_wall for phase, t in totals.items()},
        "model_execution_share": model / step_wall,
    }


def main() -> None:
    """Parse arguments, run warm-up and timed passes, print and save the breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts (default: 64)")
    parser.add_argument("--min-len", type=int, default=100, help="shortest prompt (100)")
    parser.add_argument("--max-len", type=int, default=300, help="longest prompt (300)")
    parser.add_argument("--output-len", type=int, default=128, help="tokens out (default: 128)")
    parser.add_argument("--num-iters", type=int, default=1, help="timed passes (default: 1)")
    parser.add_argument("--dtype", default="auto", help="engine dtype (default: auto)")
    parser.add_argument(
        "--quantization", default=None, help="engine quantization (default: the checkpoint's)"
    )
    parser.add_argument("--seed", type=int, default=0, help="prompt seed (default: 0)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="KV cache dtype (auto)")
    parser.add_argument(
        "--max-model-len", type=int, default=None,
        help="the engine's context limit (default: the model's; lower it for models whose "
        "full context does not fit the KV cache, e.g. Qwen3's 40,960)",
    )
    add_scheduler_steps_arg(parser)
    parser.add_argument(
        "--single-stream", action="store_true",
        help="time one request's decode steps: inside the C kernels vs outside them",
    )
    parser.add_argument("--output-json", default=None, metavar="PATH", help="write results here")
    args = parser.parse_args()

    from pagedllm import LLM

    location = locate_model(args.model)
    prompts = make_prompts(
        load_tokenizer(location), args.num_prompts, args.min_len, args.max_len, seed=args.seed
    )
    llm = LLM(model=location.path, dtype=args.dtype, quantization=args.quantization,
              kv_cache_dtype=args.kv_cache_dtype, num_scheduler_steps=args.num_scheduler_steps,
              max_model_len=args.max_model_len)
    if args.single_stream:
        result = report_single_stream(llm, prompts[0], args.output_len, args.num_iters)
        if args.output_json:
            write_json(args.output_json, {"config": vars(args), "machine": machine_info(),
                                          "load_average": load_average(), "single": result})
        return
    # Warm-up (untimed, distinct prompts so the timed passes get no prefix-cache hits).
    timer = PhaseTimer()
    step = instrument(llm, timer)
    warm = make_prompts(load_tokenizer(location), 4, 16, 32, seed=args.seed + 99)
    timed_pass(llm, step, timer, warm, 8)
    passes = []
    for _ in range(args.num_iters):
        llm.reset_prefix_cache()  # every pass computes its prompts in full
        passes.append(timed_pass(llm, step, timer, prompts, args.output_len))
    print(f"{args.num_prompts} prompts x {args.output_len} tokens, {len(passes)} pass(es):")
    for phase in (*PHASES, "other"):
        share = summarize([p["share"][phase] * 100 for p in passes])
        seconds = summarize([p["seconds"][phase] for p in passes])
        print(f"  {phase:<18} {format_stat(seconds, 2):>22} s  {format_stat(share):>20} %")
    model = summarize([p["model_execution_share"] * 100 for p in passes])
    print(f"  model execution (forward + logits + sampling): {format_stat(model)} % of step time")
    if args.output_json:
        write_json(
            args.output_json,
            {
                "config": vars(args),
                "machine": machine_info(),
                "load_average": load_average(),
                "prompts": prompts_summary(prompts),
                "passes": passes,
            },
        )


if __name__ == "__main__":
    main()
