"""benchmarks/step_bytes.py counts what a decode step reads: on a tiny float32 Llama every
linear layer's dense weight, the LM head, the norms, and the KV cache of the context; on
int4 weights the 4-bit groups with their scales (0.75 bytes a weight), not a dense copy."""

from __future__ import annotations

import torch

from pagedllm import LLM
from tests.conftest import load_benchmark


def test_float32_step_reads_every_weight_and_the_kv(tiny_llama_dir):
    step_bytes = load_benchmark("step_bytes")
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128)
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    config = llm.llm_engine.engine_config.model_config.hf_config
    linear = sum(p.numel() * 4 for name, p in model.named_parameters()
                 if name.endswith("proj.weight"))
    norms = sum(p.numel() * 4 for name, p in model.named_parameters() if "norm" in name)
    head_dim = config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    parts = step_bytes.decode_step_bytes(llm, context_len=10)
    assert parts["linear"] == linear
    assert parts["head"] == config.vocab_size * config.hidden_size * 4
    assert parts["other"] == norms
    assert parts["kv"] == 10 * kv
    assert parts["total"] == linear + parts["head"] + norms + 10 * kv


def test_int4_step_reads_the_groups_not_a_dense_copy(tiny_llama_dir):
    step_bytes = load_benchmark("step_bytes")
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization="int4", max_model_len=128)
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    c = llm.llm_engine.engine_config.model_config.hf_config
    kv_width = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    weights = c.num_hidden_layers * (2 * c.hidden_size * (c.hidden_size + kv_width)
                                     + 3 * c.hidden_size * c.intermediate_size)
    parts = step_bytes.weight_bytes(model)
    # 4-bit codes and a float16 scale and minimum per 32 weights (Q4_1's form).
    assert parts["linear"] == weights * 5 // 8
    assert parts["linear"] < weights * torch.bfloat16.itemsize


def test_moe_step_reads_only_the_routed_share_of_the_experts(tmp_path):
    """A batch-1 MoE step reads top_k of num_experts experts: their bytes count that share
    (the floor once counted every expert whole, 2.7x too many bytes on Qwen2-MoE)."""
    from tests.models.test_model_parity import _config, save_random

    step_bytes = load_benchmark("step_bytes")
    model_dir = save_random(tmp_path / "moe", _config("qwen2_moe"))
    llm = LLM(str(model_dir), dtype="float32", max_model_len=128)
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    c = llm.llm_engine.engine_config.model_config.hf_config
    expert = sum(p.numel() * 4 for name, p in model.named_parameters() if ".experts." in name)
    rest = sum(p.numel() * 4 for name, p in model.named_parameters()
               if name.endswith(("proj.weight", "gate.weight")) and ".experts." not in name)
    parts = step_bytes.weight_bytes(model)
    assert parts["linear"] == rest + expert * c.num_experts_per_tok // c.num_experts
