"""distributed_executor_backend="ray": the workers are Ray actors in a placement group on an
existing cluster (started here with `ray start --head`, as a user would on the head node),
running the same worker code as "mp": token-identical to one rank for TP=2 (tiny Llama) and
PP=2 (tiny Qwen2), and for two data-parallel engine cores each placing its worker as an
actor; a killed actor fails the engine naming its rank; the placement group is given back
at shutdown."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pagedllm import LLM
from tests.executor.test_multiproc_executor import ENGINE, PROMPTS, _params
from tests.executor.test_worker_failure import LONG, _step_until_failure

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install ray)")

RAY_BIN = Path(sys.executable).parent / "ray"
PORT = 6391


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A one-node Ray cluster for this module (4 CPUs, a small object store)."""
    if not RAY_BIN.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    temp_dir = tmp_path_factory.mktemp("ray")
    subprocess.run(
        [str(RAY_BIN), "start", "--head", f"--port={PORT}", "--num-cpus=4",
         "--object-store-memory=100000000", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        check=True, capture_output=True, timeout=120,
    )
    previous = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{PORT}"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous
        subprocess.run([str(RAY_BIN), "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _generate(model_dir, **kwargs) -> list[list[int]]:
    llm = LLM(str(model_dir), **{**ENGINE, **kwargs})
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _params(),
                               use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("arch, layout", [
    ("llama", dict(tensor_parallel_size=2)),
    ("qwen2", dict(pipeline_parallel_size=2)),
])
def test_ray_workers_give_one_ranks_tokens(arch, layout, ray_cluster, request):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    want = _generate(model_dir)
    assert _generate(model_dir, distributed_executor_backend="ray", **layout) == want
    ray.init(address=os.environ["RAY_ADDRESS"])
    try:  # the placement group's CPUs come back (Ray frees them asynchronously)
        for _ in range(100):
            if ray.available_resources().get("CPU") == 4:
                break
            time.sleep(0.1)
        assert ray.available_resources().get("CPU") == 4
    finally:
        ray.shutdown()


def test_killed_ray_worker_names_its_rank(tiny_llama_dir, ray_cluster):
    from pagedllm.engine.arg_utils import EngineArgs
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.executor.distributed import WorkerFailedError

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(tiny_llama_dir), dtype="float32", kv_cache_memory_bytes=2**22,
        tensor_parallel_size=2, distributed_executor_backend="ray",
    ))
    try:
        executor = engine.engine_core.engine_core.executor
        engine.add_request("a", {"prompt_token_ids": [5, 6, 7, 8]}, LONG)
        engine.step()
        os.kill(executor.worker_pids[0], signal.SIGKILL)
        error = _step_until_failure(engine)
        assert isinstance(error, WorkerFailedError), error
        assert "worker rank 0" in str(error)
    finally:
        engine.shutdown()


def test_data_parallel_cores_with_ray_workers(tiny_llama_dir, ray_cluster):
    """-dp 2 with the "ray" backend: each engine core places its worker as a Ray actor."""
    import asyncio

    from pagedllm.engine.arg_utils import EngineArgs
    from pagedllm.engine.async_llm import AsyncLLM

    want = _generate(tiny_llama_dir)
    engine = AsyncLLM.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), data_parallel_size=2,
                   distributed_executor_backend="ray", **ENGINE),
        multiprocessing=True,
    )
    params = _params()

    async def one(index: int) -> list[int]:
        last = None
        async for output in engine.generate({"prompt_token_ids": PROMPTS[index]},
                                            params[index], f"r{index}"):
            last = output
        return list(last.outputs[0].token_ids)

    async def run() -> list[list[int]]:
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))

    try:
        assert asyncio.run(run()) == want
        assert engine.engine_core.num_requests_sent == [3, 3]
    finally:
        engine.shutdown()
