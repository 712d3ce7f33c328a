"""A tensor-parallel worker killed mid-generation fails the engine within seconds with an
error naming the rank, and leaves no process behind: with the engine core in this process
(WorkerFailedError) and in its own process (EngineDeadError carrying the reason). Method
calls reach every rank; a ValueError on the ranks comes back as a ValueError."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from pagedllm import SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.exceptions import EngineDeadError
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.executor.distributed import WorkerFailedError

ARGS = dict(dtype="float32", kv_cache_memory_bytes=2**22, tensor_parallel_size=2)
LONG = SamplingParams(temperature=0, max_tokens=900, ignore_eos=True)
# Generous: failing takes well under a second (the executor polls every 0.1 s); the bound
# only tells a failure from a hang.
HANG_S = 60


def _step_until_failure(engine: LLMEngine) -> BaseException | None:
    """Step on a thread until it raises; the error (None: it hung past HANG_S)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            while True:
                engine.step()
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            caught.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    return caught[0] if caught else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    """True once none of `pids` runs (they leave when their pipe closes: give them a moment)."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_killed_worker_fails_the_engine_naming_the_rank(tiny_llama_dir):
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_llama_dir), **ARGS))
    executor = engine.engine_core.engine_core.executor
    pids = executor.worker_pids
    try:
        engine.add_request("a", {"prompt_token_ids": [5, 6, 7, 8]}, LONG)
        for _ in range(3):
            engine.step()
        with pytest.raises(ValueError, match="LoRA is off"):  # every rank answered
            executor.collective_rpc("list_loras")
        os.kill(pids[1], signal.SIGKILL)
        error = _step_until_failure(engine)
        assert isinstance(error, WorkerFailedError), error
        assert "worker rank 1" in str(error) and "exit code -9" in str(error)
    finally:
        engine.shutdown()
    assert _gone(pids)


def test_killed_worker_fails_the_core_process(tiny_llama_dir):
    engine = LLMEngine.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), **ARGS), multiprocessing=True
    )
    core_pid = engine.engine_core.pid
    # The core's spawned children (not multiprocessing's resource tracker): the two ranks.
    workers = [p.pid for p in psutil.Process(core_pid).children()
               if "spawn_main" in " ".join(p.cmdline())]
    try:
        assert len(workers) == 2
        engine.add_request("a", {"prompt_token_ids": [5, 6, 7, 8]}, LONG)
        engine.step()
        os.kill(workers[0], signal.SIGKILL)
        error = _step_until_failure(engine)
        assert isinstance(error, EngineDeadError), error
        assert "worker rank" in str(error)
    finally:
        engine.shutdown()
    assert _gone([core_pid, *workers])


def test_an_engine_left_open_at_exit_reports_no_failure(tiny_llama_dir) -> None:
    """A script that ends without shutting its tensor-parallel engine down exits quietly:
    the workers leaving with the interpreter (multiprocessing stops them at exit) is no
    "worker is gone" failure. The script's first exit hook runs last and gives the
    executor's receiver thread time to see the stopped workers."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import atexit, time
        atexit.register(time.sleep, 1.0)
        from pagedllm.engine.arg_utils import EngineArgs
        from pagedllm.engine.llm_engine import LLMEngine
        engine = LLMEngine.from_engine_args(EngineArgs(model={str(tiny_llama_dir)!r}, **{ARGS!r}))
        print("built", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "built" in done.stdout
    assert "worker is gone" not in done.stderr
    assert "Logging error" not in done.stderr
