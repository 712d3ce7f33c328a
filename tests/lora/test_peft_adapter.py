"""Adapters LoRA is not built for are refused with a ValueError naming what, never dropped."""

from __future__ import annotations

import json

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.lora.request import LoRARequest
from tests.lora.test_lora_engine import make_adapter


@pytest.fixture(scope="module")
def adapter(tiny_llama_dir, tmp_path_factory):
    return make_adapter(tiny_llama_dir, tmp_path_factory.mktemp("lora") / "a", 8, 16,
                        ["q_proj", "v_proj"], False, seed=0)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), dtype="float32", enable_lora=True, max_lora_rank=8,
               max_model_len=128)


def _generate(llm, lora):
    return llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2),
                        use_tqdm=False, lora_request=lora)


def _variant(adapter, tmp_path, **changes):
    folder = tmp_path / "variant"
    folder.mkdir()
    config = json.loads((adapter / "adapter_config.json").read_text())
    config.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(
        (adapter / "adapter_model.safetensors").read_bytes()
    )
    return folder


@pytest.mark.parametrize(("changes", "named"), [
    ({"use_dora": True}, "DoRA"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "embed_tokens"),
    ({"target_modules": ["lm_head"]}, "lm_head"),
    ({"bias": "all"}, "bias"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"r": 16}, "max_lora_rank"),
    ({"peft_type": "IA3"}, "IA3"),
])
def test_unsupported_adapters_are_refused(llm, adapter, tmp_path, changes, named):
    with pytest.raises(ValueError, match=named):
        _generate(llm, LoRARequest("bad", 7, str(_variant(adapter, tmp_path, **changes))))


def test_bad_requests(llm, adapter, tiny_llama_dir, tmp_path):
    with pytest.raises(ValueError, match="adapter_config.json"):
        _generate(llm, LoRARequest("missing", 2, str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("zero", 0, str(adapter))
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128)
    with pytest.raises(ValueError, match="enable_lora"):
        _generate(plain, LoRARequest("a", 1, str(adapter)))
    with pytest.raises(ValueError, match="max_loras"):
        LLM(str(tiny_llama_dir), enable_lora=True, max_loras=0)
    # A valid adapter still runs after the refusals.
    assert _generate(llm, LoRARequest("ok", 3, str(adapter)))[0].outputs[0].token_ids
