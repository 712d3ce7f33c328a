"""hf_config helpers (transformers 4 and 5 attribute names) and the model registry."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import LlamaConfig, MistralConfig, Qwen2Config

from pagedllm.model_loader.hf_config import (
    get_architecture,
    get_checkpoint_dtype,
    get_max_model_len,
    get_rope_scaling,
    get_rope_theta,
    load_hf_config,
    resolve_dtype,
)
from pagedllm.models.registry import (
    ModelRegistry,
    check_model_config,
    supported_architectures,
)


def test_load_and_architecture(tiny_llama_dir: Path, tiny_qwen2_dir: Path) -> None:
    assert get_architecture(load_hf_config(str(tiny_llama_dir), None)) == "LlamaForCausalLM"
    assert get_architecture(load_hf_config(str(tiny_qwen2_dir), None)) == "Qwen2ForCausalLM"


def test_load_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        load_hf_config(str(tmp_path), None)


def test_architecture_from_model_type_when_list_is_absent() -> None:
    # GGUF-derived configs have no `architectures`.
    assert get_architecture(LlamaConfig()) == "LlamaForCausalLM"
    assert get_architecture(Qwen2Config()) == "Qwen2ForCausalLM"
    with pytest.raises(ValueError, match="model_type='gpt_neox'"):
        get_architecture(SimpleNamespace(architectures=None, model_type="gpt_neox"))


def test_max_model_len(tiny_llama_dir: Path) -> None:
    config = load_hf_config(str(tiny_llama_dir), None)
    assert get_max_model_len(config, None) == 1024
    assert get_max_model_len(config, 512) == 512
    with pytest.raises(ValueError, match="max_model_len=2048"):
        get_max_model_len(config, 2048)
    with pytest.raises(ValueError, match="at least 1"):
        get_max_model_len(config, 0)


def test_max_model_len_other_keys() -> None:
    assert get_max_model_len(SimpleNamespace(n_positions=256), None) == 256
    assert get_max_model_len(SimpleNamespace(), None) == 2048


@pytest.mark.parametrize(
    ("checkpoint", "device", "is_gguf", "expected"),
    [
        ("float32", "cpu", False, "float32"),
        ("float32", "cuda", False, "float32"),
        ("bfloat16", "cpu", False, "bfloat16"),
        ("float16", "cpu", False, "bfloat16"),
        ("float16", "cuda:0", False, "float16"),
        ("float16", "cuda", True, "bfloat16"),
        (None, "cpu", True, "bfloat16"),
        (None, "cpu", False, "float32"),
        (None, "cuda", False, "bfloat16"),
    ],
)
def test_resolve_auto_dtype(checkpoint, device, is_gguf, expected) -> None:
    config = LlamaConfig(dtype=checkpoint)
    assert resolve_dtype("auto", config, device, is_gguf) == expected


@pytest.mark.parametrize(
    ("checkpoint", "is_gguf", "expected"),
    [("bfloat16", False, "float32"), ("float16", False, "float32"), (None, True, "float32"),
     ("float32", False, "float32")],
)
def test_auto_dtype_avoids_emulated_bf16_on_cpu(checkpoint, is_gguf, expected) -> None:
    """Where bf16 matmuls are emulated and no W4A8 kernel takes the weights, float32."""
    config = LlamaConfig(dtype=checkpoint)
    assert resolve_dtype("auto", config, "cpu", is_gguf, cpu_bf16_is_fast=False) == expected
    assert resolve_dtype("bfloat16", config, "cpu", is_gguf, cpu_bf16_is_fast=False) == "bfloat16"
    assert resolve_dtype("auto", LlamaConfig(dtype="float16"), "cuda", False, False) == "float16"


def test_resolve_explicit_and_invalid_dtype() -> None:
    config = LlamaConfig(dtype="bfloat16")
    assert resolve_dtype("float16", config, "cpu", False) == "float16"
    with pytest.raises(ValueError, match="auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", config, "cpu", False)


def test_checkpoint_dtype_both_spellings(tiny_llama_dir: Path) -> None:
    assert get_checkpoint_dtype(load_hf_config(str(tiny_llama_dir), None)) == "float32"
    # transformers 4 configs store `torch_dtype` instead of `dtype`.
    assert get_checkpoint_dtype(SimpleNamespace(torch_dtype="float16")) == "float16"
    assert get_checkpoint_dtype(SimpleNamespace()) is None


def test_rope_parameters(tiny_llama3_dir: Path, tiny_qwen2_dir: Path) -> None:
    llama3 = load_hf_config(str(tiny_llama3_dir), None)
    assert get_rope_theta(llama3) == 10000.0
    scaling = get_rope_scaling(llama3)
    assert scaling is not None and scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
    assert "rope_theta" not in scaling
    qwen2 = load_hf_config(str(tiny_qwen2_dir), None)
    assert get_rope_theta(qwen2) == 1000000.0
    assert get_rope_scaling(qwen2) is None


def test_rope_parameters_transformers4_style() -> None:
    old = SimpleNamespace(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    assert get_rope_theta(old) == 5e5
    assert get_rope_scaling(old) == {"rope_type": "linear", "factor": 2.0}
    assert get_rope_scaling(SimpleNamespace(rope_scaling=None)) is None
    assert get_rope_theta(SimpleNamespace()) == 10000.0


def test_registry_names_and_errors() -> None:
    assert supported_architectures() == [
        "GPT2LMHeadModel",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Idefics3ForConditionalGeneration",
        "LlamaForCausalLM",
        "LlavaForConditionalGeneration",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "OPTForCausalLM",
        "Phi3ForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
    ]
    with pytest.raises(ValueError, match="GPT2LMHeadModel, Gemma3ForCausalLM, Gemma3ForCond"):
        ModelRegistry().resolve("GPTNeoXForCausalLM")


def test_registry_imports_lazily() -> None:
    registry = ModelRegistry({"Fake": ("collections", "OrderedDict")})
    from collections import OrderedDict

    assert registry.resolve("Fake") is OrderedDict


def test_unsupported_configs_fail_when_the_engine_is_configured() -> None:
    """check_model_config builds the model on the meta device: its own ValueError."""
    from transformers import OPTConfig

    check_model_config("MistralForCausalLM", MistralConfig(sliding_window=4096))
    with pytest.raises(ValueError, match="do_layer_norm_before"):
        check_model_config("OPTForCausalLM", OPTConfig(do_layer_norm_before=False))
    with pytest.raises(ValueError, match="not supported"):
        check_model_config("GPTNeoXForCausalLM", Qwen2Config())
