"""Tensor and pipeline parallel engines ("mp": a worker process per rank) give the tokens of
one rank, token for token, in float32: tiny Llama (GQA: one KV head a rank under TP=2) and
Qwen2 (q/k/v biases, tied embeddings), with chunked prefill, prefix caching, a seeded
sampled request (only the driver rank samples) and recompute preemption while pipeline
batches are in flight."""

from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.executor.multiproc import MultiprocExecutor

# Repeated prefixes hit the prefix cache; 16-token steps chunk the longer prompts.
PROMPTS = [[5 + i, 17, 23 + i, 9, 41] * (i + 1) for i in range(5)] + [[5, 17, 23, 9, 41] * 3]
ENGINE = dict(dtype="float32", kv_cache_memory_bytes=2**22, max_num_batched_tokens=16,
              enable_prefix_caching=True)


def _params() -> list[SamplingParams]:
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=10, ignore_eos=True)
    return [greedy] * (len(PROMPTS) - 1) + [seeded]


def _generate(model_dir, **kwargs) -> list[list[int]]:
    llm = LLM(str(model_dir), **{**ENGINE, **kwargs})
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _params(),
                               use_tqdm=False)
        executor = llm.llm_engine.engine_core.engine_core.executor
        if kwargs:
            assert isinstance(executor, MultiprocExecutor)
            # collective_rpc reaches every rank's worker process, in rank order, with a
            # function sent by value (a lambda) and its args and kwargs.
            ranks = llm.collective_rpc(
                lambda worker, x, y=0: (torch.distributed.get_rank(), x + y),
                args=(2,), kwargs={"y": 1})
            assert ranks == [(rank, 3) for rank in range(executor.world_size)]
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def one_rank(tiny_llama_dir, tiny_qwen2_dir) -> dict[str, list[list[int]]]:
    return {"llama": _generate(tiny_llama_dir), "qwen2": _generate(tiny_qwen2_dir)}


@pytest.mark.parametrize("arch, layout", [
    ("llama", dict(tensor_parallel_size=2)),
    ("qwen2", dict(tensor_parallel_size=2)),
    ("qwen2", dict(pipeline_parallel_size=2, distributed_executor_backend="mp")),
])
def test_ranks_give_one_ranks_tokens(arch, layout, one_rank, request):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    assert _generate(model_dir, **layout) == one_rank[arch]


def test_pipeline_keeps_a_batch_per_stage_in_flight(tiny_llama_dir, one_rank):
    llm = LLM(str(tiny_llama_dir), pipeline_parallel_size=2, **ENGINE)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _params(),
                               use_tqdm=False)
        core = llm.llm_engine.engine_core.engine_core
        assert core.executor.max_concurrent_batches == 2
        assert core.num_overlapped_batches > 0  # the second stage had work meanwhile
    finally:
        llm.llm_engine.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outputs] == one_rank["llama"]


def test_tensor_and_pipeline_together(tiny_llama_dir, one_rank):
    got = _generate(tiny_llama_dir, tensor_parallel_size=2, pipeline_parallel_size=2)
    assert got == one_rank["llama"]


def test_pipeline_preempts_while_batches_are_in_flight(tiny_llama_dir, one_rank):
    # 9 usable blocks of 8 tokens for 6 requests growing to 35 tokens: recompute preemptions.
    kwargs = dict(pipeline_parallel_size=2, num_gpu_blocks_override=10, block_size=8,
                  kv_cache_memory_bytes=None, max_model_len=64)
    llm = LLM(str(tiny_llama_dir), **{**ENGINE, **kwargs})
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _params(),
                               use_tqdm=False)
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        assert scheduler.num_preemptions > 0
        assert scheduler.kv_cache_manager.usage == 0.0  # every block came back
    finally:
        llm.llm_engine.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outputs][:-1] == one_rank["llama"][:-1]


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["split-experts", "ep"])
def test_moe_model_over_two_ranks(expert_parallel, tiny_tokenizer_dir, tmp_path):
    """Qwen2-MoE (routed and shared experts, one dense layer) at TP=2, each expert split or
    whole experts per rank (enable_expert_parallel): one rank's tokens."""
    import shutil

    from transformers import AutoTokenizer

    from tests.models.test_model_parity import arch_config, save_random

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    model_dir = save_random(tmp_path, arch_config("qwen2_moe", vocab_size=len(tokenizer)))
    for name in tiny_tokenizer_dir.iterdir():
        shutil.copy(name, tmp_path / name.name)
    want = _generate(model_dir)
    got = _generate(model_dir, tensor_parallel_size=2, enable_expert_parallel=expert_parallel)
    assert got == want
