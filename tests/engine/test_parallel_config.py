"""The parallel layout under vLLM's names: tensor / pipeline / data parallel sizes, the
executor backend and expert parallelism, from EngineArgs, LLM and the CLI (-tp/-pp/-dp).
Layouts the model cannot take, and features not built for several ranks, are refused by
name before any worker starts."""

from __future__ import annotations

import pytest

from pagedllm import LLM
from pagedllm.config import ParallelConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.entrypoints.cli import parse_serve_args


def test_one_rank_is_the_default(tiny_llama_dir):
    config = EngineArgs(model=str(tiny_llama_dir)).create_engine_config()
    assert config.parallel_config == ParallelConfig()
    assert config.parallel_config.world_size == 1
    uni = EngineArgs(model=str(tiny_llama_dir), distributed_executor_backend="uni",
                     enable_expert_parallel=True).create_engine_config().parallel_config
    assert uni.distributed_executor_backend == "uni" and uni.enable_expert_parallel


@pytest.mark.parametrize("kwargs, words", [
    (dict(tensor_parallel_size=3), "tensor_parallel_size=3 does not divide the model's 4"),
    (dict(tensor_parallel_size=8), "tensor_parallel_size=8 does not divide"),
    (dict(pipeline_parallel_size=3), "pipeline_parallel_size=3 exceeds the model's 2 layers"),
    (dict(tensor_parallel_size=2, enable_lora=True), "enable_lora with tensor_parallel_size=2"),
    (dict(pipeline_parallel_size=2, speculative_config={"method": "ngram",
                                                        "num_speculative_tokens": 2}),
     "speculative_config with .*pipeline_parallel_size=2"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be a positive integer"),
    (dict(distributed_executor_backend="slurm"), "distributed_executor_backend must be"),
    (dict(distributed_executor_backend="uni", tensor_parallel_size=2), "'uni' runs one rank"),
])
def test_bad_or_unbuilt_layouts_are_named(tiny_llama_dir, kwargs, words):
    with pytest.raises(ValueError, match=words):
        EngineArgs(model=str(tiny_llama_dir), **kwargs).create_engine_config()


def test_llm_takes_the_names(tiny_llama_dir):
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        LLM(str(tiny_llama_dir), tensor_parallel_size=3)
    config = EngineArgs(model=str(tiny_llama_dir), tensor_parallel_size=2,
                        pipeline_parallel_size=2).create_engine_config().parallel_config
    assert config.world_size == 4


def test_cli_short_flags():
    _, engine = parse_serve_args(["serve", "m", "-tp", "2", "-pp", "3", "-dp", "4",
                                  "--distributed-executor-backend", "ray",
                                  "--enable-expert-parallel"])
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size,
            engine.data_parallel_size) == (2, 3, 4)
    assert engine.distributed_executor_backend == "ray" and engine.enable_expert_parallel
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "m", "--distributed-executor-backend", "slurm"])
