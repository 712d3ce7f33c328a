"""Safetensors iteration (single, sharded, stray files) and get_model over a safetensors folder."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from pagedllm.config import ModelConfig
from pagedllm.model_loader import loader
from pagedllm.model_loader.hf_config import get_architecture, load_hf_config
from pagedllm.model_loader.safetensors import (
    iterate_safetensors_weights,
    list_safetensors_files,
)


def test_single_file_matches_load_file(tiny_llama_dir: Path) -> None:
    expected = load_file(tiny_llama_dir / "model.safetensors")
    got = dict(iterate_safetensors_weights(str(tiny_llama_dir)))
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_dtype_cast(tiny_llama_dir: Path) -> None:
    for _, tensor in iterate_safetensors_weights(str(tiny_llama_dir), dtype=torch.bfloat16):
        assert tensor.dtype == torch.bfloat16


def _write_shards(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for index, chunk in enumerate((names[:half], names[half:])):
        shard = f"model-0000{index + 1}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in chunk}, folder / shard)
        weight_map.update(dict.fromkeys(chunk, shard))
    index_file = folder / "model.safetensors.index.json"
    index_file.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_with_index_ignores_stray_files(tmp_path: Path, tiny_llama_dir: Path) -> None:
    tensors = load_file(tiny_llama_dir / "model.safetensors")
    _write_shards(tmp_path, tensors)
    save_file({"stray": torch.zeros(1)}, tmp_path / "consolidated.safetensors")
    got = list(iterate_safetensors_weights(str(tmp_path)))
    assert sorted(name for name, _ in got) == sorted(tensors)
    assert all(torch.equal(t, tensors[n]) for n, t in got)


def test_index_naming_missing_shard(tmp_path: Path, tiny_llama_dir: Path) -> None:
    _write_shards(tmp_path, load_file(tiny_llama_dir / "model.safetensors"))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="model-00002-of-00002.safetensors"):
        list_safetensors_files(str(tmp_path))


def test_unindexed_folder_skips_consolidated(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2)}, tmp_path / "model.safetensors")
    save_file({"b": torch.ones(2)}, tmp_path / "consolidated.safetensors")
    assert [n for n, _ in iterate_safetensors_weights(str(tmp_path))] == ["a"]


def test_folder_without_weights(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"No \*.safetensors"):
        list_safetensors_files(str(tmp_path))


class _HFNamedLlama(transformers.LlamaForCausalLM):
    """Stand-in model: transformers' Llama with a name-for-name load_weights."""

    skip: frozenset[str] = frozenset()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in self.skip:
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded


def _model_config(model_dir: Path, dtype: str, gguf_file: str | None = None) -> ModelConfig:
    hf_config = load_hf_config(str(model_dir), gguf_file)
    return ModelConfig(
        model=str(model_dir),
        model_dir=str(model_dir),
        gguf_file=gguf_file,
        dtype=dtype,
        max_model_len=256,
        seed=0,
        architecture=get_architecture(hf_config),
        hf_config=hf_config,
    )


def test_get_model_loads_every_weight(monkeypatch, tiny_llama_dir: Path) -> None:
    monkeypatch.setattr(loader, "resolve_model_class", lambda arch: _HFNamedLlama)
    model = loader.get_model(_model_config(tiny_llama_dir, "bfloat16"))
    assert torch.get_default_dtype() == torch.float32
    assert not model.training
    expected = load_file(tiny_llama_dir / "model.safetensors")
    for name, param in model.named_parameters():
        assert param.dtype == torch.bfloat16 and not param.requires_grad
        assert torch.equal(param, expected[name].to(torch.bfloat16))


def test_get_model_reports_missing_weights(monkeypatch, tiny_llama_dir: Path) -> None:
    class Partial(_HFNamedLlama):
        skip = frozenset({"model.norm.weight"})

    monkeypatch.setattr(loader, "resolve_model_class", lambda arch: Partial)
    with pytest.raises(ValueError, match="1 parameter.*model.norm.weight"):
        loader.get_model(_model_config(tiny_llama_dir, "float32"))
    assert torch.get_default_dtype() == torch.float32


def test_get_model_rejects_unsupported_architecture(tmp_path: Path, tiny_llama_dir: Path) -> None:
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not supported.*LlamaForCausalLM"):
        loader.get_model(_model_config(tmp_path / "m", "float32"))


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_get_model_with_pagedllm_models(request, fixture: str) -> None:
    """Runs once models/llama.py and models/qwen2.py exist."""
    module = "pagedllm.models.llama" if fixture == "tiny_llama_dir" else "pagedllm.models.qwen2"
    pytest.importorskip(module)
    model_dir = request.getfixturevalue(fixture)
    model = loader.get_model(_model_config(model_dir, "float32"))
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
