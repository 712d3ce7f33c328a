"""benchmarks/step_breakdown.py --single-stream splits a decode step's wall time into the
time inside the C kernels and the time outside them: on a tiny int4 Llama (the decode
stack's path) the kernels are timed, and the two parts add up to the step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pagedllm import LLM
from pagedllm.layers import cpu_ops
from tests.conftest import load_benchmark


def _single_stream_steps(tiny_llama_dir, monkeypatch, output_len: int, **llm_args):
    """step_breakdown's single-stream pass over a tiny int4 Llama, its kernel clock on."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    breakdown = load_benchmark("step_breakdown")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=128,
              **llm_args)
    clock = breakdown.KernelClock()
    try:
        assert clock.install()
        return breakdown.single_stream_pass(llm, clock, [5, 17, 42, 8], output_len=output_len)
    finally:
        clock.uninstall()
        sys.modules.pop("common", None)


@pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no C compiler")
def test_single_stream_splits_each_step(tiny_llama_dir, monkeypatch):
    steps = _single_stream_steps(tiny_llama_dir, monkeypatch, 6)
    assert len(steps) == 5  # six tokens: the prefill's, then five decode steps
    for wall, kernels in steps:
        assert 0 < kernels < wall  # the decode stack ran in C, and Python around it


@pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no C compiler")
def test_single_stream_report_splits_the_outside_time_by_phase(tiny_llama_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    breakdown = load_benchmark("step_breakdown")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=128)
    try:
        results = breakdown.report_single_stream(llm, [5, 17, 42, 8], 6, 1)
    finally:
        sys.modules.pop("common", None)
    assert set(results) == set(breakdown.STREAM_KINDS)  # LLM.generate's way, and a stream
    for result in results.values():
        phases = result["outside_by_phase_us"]
        assert set(phases) == {
            "model, outside kernels", "schedule", "input preparation", "scheduler update",
            "output processing", "other",
        }
        for phase in ("schedule", "input preparation", "output processing"):
            assert phases[phase] > 0  # each timed in every decode step
        assert 0 < result["kernel_ms"] < result["step_ms"]
    # The phase wrappers are gone again (the classes are the whole process's).
    from pagedllm.core.scheduler import Scheduler
    assert Scheduler.schedule.__qualname__ == "Scheduler.schedule"
    runner = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner
    assert "run" not in vars(runner.decode_step) and "forward" not in vars(runner.model)
    from pagedllm.kernels.abi import FUNCTIONS
    from pagedllm.platform import cpu_platform

    library = cpu_platform().kernel_library()
    assert library is not None
    for function in FUNCTIONS:  # the kernel clock's wrappers are gone too
        assert getattr(library.lib, function.name).restype is function.restype


@pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no C compiler")
def test_a_multi_step_counts_as_its_decode_steps(tiny_llama_dir, monkeypatch):
    steps = _single_stream_steps(tiny_llama_dir, monkeypatch, 10, num_scheduler_steps=4)
    # Ten tokens: the prefill's, then engine steps of 4, 4 and 1 decode steps, each
    # counted as that many steps of its mean time.
    assert len(steps) == 9
    assert steps[0] == steps[3] and steps[4] == steps[7]
    for wall, kernels in steps:
        assert 0 < kernels < wall  # the C loop's call is timed as kernel time
