"""Iterate (name, tensor) over a folder's single or sharded *.safetensors checkpoint.

Files are memory-mapped through `safe_open`, so only one tensor at a time is materialized.
Knows nothing about models: names are yielded exactly as stored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"


def list_safetensors_files(model_dir: str) -> list[str]:
    """Paths of the checkpoint's .safetensors files, in a stable order.

    Uses model.safetensors.index.json when present, so stray files (e.g. Mistral's
    consolidated.safetensors beside the HF shards) are not loaded twice.

    Raises:
        ValueError: when the folder has no .safetensors file or the index names a missing one.
    """
    index_path = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        files = [os.path.join(model_dir, name) for name in sorted(set(weight_map.values()))]
        missing = [path for path in files if not os.path.isfile(path)]
        if missing:
            raise ValueError(
                f"{INDEX_FILE} in {model_dir!r} names shards that are not there: "
                f"{', '.join(os.path.basename(p) for p in missing)}. Download the full checkpoint."
            )
        return files
    names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    # Mistral repos ship consolidated.safetensors (Mistral names) next to the HF file.
    hf_names = [n for n in names if not n.startswith("consolidated")]
    names = hf_names or names
    if not names:
        raise ValueError(
            f"No *.safetensors weights in {model_dir!r}. pagedllm loads safetensors folders "
            "or .gguf files (PyTorch .bin checkpoints are not supported)."
        )
    return [os.path.join(model_dir, name) for name in names]


def iterate_safetensors_weights(
    model_dir: str, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every (name, tensor) of the folder's checkpoint on CPU, cast to `dtype` if given."""
    for path in list_safetensors_files(model_dir):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open handles are not dict-like)
                tensor = f.get_tensor(name)
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(dtype)
                yield name, tensor
