"""Reading a speculator checkpoint folder (EAGLE, EAGLE-3, Medusa heads): its config.json
and all its tensors, from safetensors files or PyTorch pickles, as published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def read_config(path: str | Path) -> dict[str, Any]:
    """The folder's config.json ({} if it has none)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return {}
    with open(config_file) as handle:
        config: dict[str, Any] = json.load(handle)
    return config


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor in the folder's *.safetensors files, else its *.bin / *.pt pickles.

    Raises:
        ValueError: when the folder holds no weights.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"speculative_config model {str(path)!r} is not a folder.")
    tensors: dict[str, torch.Tensor] = {}
    safetensors_files = sorted(folder.glob("*.safetensors"))
    if safetensors_files:
        from safetensors.torch import load_file

        for file in safetensors_files:
            tensors.update(load_file(str(file)))
        return tensors
    for file in sorted([*folder.glob("*.bin"), *folder.glob("*.pt")]):
        loaded = torch.load(file, map_location="cpu", weights_only=True)
        tensors.update({k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)})
    if not tensors:
        raise ValueError(f"speculative_config model {str(path)!r} holds no weights.")
    return tensors
