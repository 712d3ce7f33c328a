"""Read the transformers config of a checkpoint and derive engine settings from it.

Covers architecture name, `max_model_len`, dtype choice and rope parameters, papering over the
transformers 4 → 5 renames (`torch_dtype` → `dtype`, `rope_theta`/`rope_scaling` →
`rope_parameters`) so callers never touch version-specific attributes. Loads no weights.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from pagedllm.config import SUPPORTED_DTYPES
from pagedllm.model_loader.gguf_cache import config_folder
from pagedllm.models.registry import MODEL_TYPE_TO_ARCHITECTURE
from pagedllm.platform import get_platform

# Config attributes that bound the context length, by the names different families use.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
)

# Fallback when a config names no length at all (old or unusual checkpoints).
_DEFAULT_MAX_MODEL_LEN = 2048


def load_hf_config(model_dir: str, gguf_file: str | None) -> PretrainedConfig:
    """Load the transformers config from `model_dir`'s config.json or from the GGUF metadata."""
    if gguf_file is not None:  # converted once per file (gguf_cache.py)
        return AutoConfig.from_pretrained(config_folder(os.path.join(model_dir, gguf_file)))
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{model_dir!r} has no config.json; pass an HF folder or a .gguf file.")
    return AutoConfig.from_pretrained(model_dir)


def get_architecture(hf_config: PretrainedConfig) -> str:
    """HF `architectures[0]`, or the class implied by `model_type` when that list is absent."""
    architectures = getattr(hf_config, "architectures", None)
    if architectures:
        return str(architectures[0])
    model_type = getattr(hf_config, "model_type", None)
    if model_type in MODEL_TYPE_TO_ARCHITECTURE:
        return MODEL_TYPE_TO_ARCHITECTURE[model_type]
    raise ValueError(
        f"Cannot tell the architecture of this checkpoint (model_type={model_type!r}, no "
        f"`architectures` in its config). Known model types: "
        f"{', '.join(sorted(MODEL_TYPE_TO_ARCHITECTURE))}."
    )


def get_model_max_len(hf_config: PretrainedConfig) -> int:
    """The longest context the checkpoint supports, from its position-embedding limits."""
    lengths = [
        value
        for key in _MAX_LEN_KEYS
        if isinstance(value := getattr(hf_config, key, None), int) and value > 0
    ]
    return min(lengths) if lengths else _DEFAULT_MAX_MODEL_LEN


def get_max_model_len(hf_config: PretrainedConfig, requested: int | None) -> int:
    """`requested` after checking it against the model's limit, or that limit when None.

    Raises:
        ValueError: when `requested` is not positive or exceeds the model's context length.
    """
    model_max_len = get_model_max_len(hf_config)
    if requested is None:
        return model_max_len
    if requested < 1:
        raise ValueError(f"max_model_len must be at least 1, got {requested}.")
    if requested > model_max_len:
        raise ValueError(
            f"max_model_len={requested} is larger than the model's context length "
            f"({model_max_len}, from its max_position_embeddings). Pass max_model_len <= "
            f"{model_max_len}, or leave it unset to use the model's length."
        )
    return requested


def get_checkpoint_dtype(hf_config: PretrainedConfig) -> str | None:
    """The dtype name the checkpoint was saved in ("bfloat16", ...), or None if unrecorded."""
    dtype = getattr(hf_config, "dtype", None)
    if dtype is None:
        # transformers 4 kept it as `torch_dtype`; reading that property on 5 only warns, so
        # look in the instance dict instead of calling getattr.
        dtype = vars(hf_config).get("torch_dtype")
    if dtype is None:
        return None
    return str(dtype).removeprefix("torch.")


def resolve_dtype(
    dtype: str,
    hf_config: PretrainedConfig,
    device: str,
    is_gguf: bool,
    cpu_bf16_is_fast: bool = True,
) -> str:
    """Choose the torch dtype name the model runs in.

    "auto" picks the checkpoint's dtype, except: GGUF weights are dequantized to bfloat16;
    float16 becomes bfloat16 on CPU (CPU half-precision matmuls are slow and overflow-prone);
    float32 checkpoints stay float32; an unrecorded dtype means float32 on CPU and bfloat16
    elsewhere. On a CPU where bfloat16 would be slow (`cpu_bf16_is_fast` False: no native
    bf16 matmuls and no W4A8 kernels for the weights, see platform/cpu_plan.py) every bfloat16
    choice becomes float32, which torch runs at full speed there. Explicit names are
    returned as given.

    Raises:
        ValueError: for a name outside SUPPORTED_DTYPES.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SUPPORTED_DTYPES)}; got {dtype!r}.")
    if dtype != "auto":
        return dtype
    half_native = get_platform(device).half_precision_native
    if is_gguf:
        chosen = "bfloat16"
    else:
        checkpoint_dtype = get_checkpoint_dtype(hf_config)
        if checkpoint_dtype not in ("float32", "bfloat16", "float16"):
            chosen = "bfloat16" if half_native else "float32"
        elif checkpoint_dtype == "float16" and not half_native:
            chosen = "bfloat16"
        else:
            chosen = checkpoint_dtype
    if not half_native and chosen == "bfloat16" and not cpu_bf16_is_fast:
        return "float32"
    return chosen


def get_rope_theta(hf_config: PretrainedConfig, default: float = 10000.0) -> float:
    """The rope base frequency, from `rope_parameters` (transformers 5) or `rope_theta` (4)."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = vars(hf_config).get("rope_theta")
    return float(theta) if theta is not None else default


def get_rope_scaling(hf_config: PretrainedConfig) -> dict[str, Any] | None:
    """The rope scaling dict (with "rope_type"), or None for plain rope.

    transformers 5 merges theta and scaling into `rope_parameters` with rope_type "default"
    for plain rope; transformers 4 keeps `rope_scaling` (None, or a dict with "type" or
    "rope_type").
    """
    params = getattr(hf_config, "rope_parameters", None)
    if not isinstance(params, dict):
        params = vars(hf_config).get("rope_scaling")
    if not isinstance(params, dict):
        return None
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    if rope_type == "default":
        return None
    return {"rope_type": rope_type, **scaling}
