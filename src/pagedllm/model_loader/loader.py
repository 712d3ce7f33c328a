"""Build a model for a ModelConfig and fill it from its checkpoint.

Resolves the class through the model registry, constructs it under the target dtype and
device, streams HF-named weights (safetensors or GGUF) through `model.load_weights`, and fails
loudly if a parameter was left unfilled. Owns no model code and no KV cache.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import torch

from pagedllm.config import ModelConfig
from pagedllm.layers.embedding import LMHead
from pagedllm.layers.linear import Linear
from pagedllm.layers.quantization import GroupCodes
from pagedllm.logger import init_logger
from pagedllm.model_loader.checkpoint_quantization import iterate_weights
from pagedllm.model_loader.gguf import iterate_gguf_weights
from pagedllm.model_loader.safetensors import iterate_safetensors_weights
from pagedllm.models.registry import resolve_model_class, resolve_runner
from pagedllm.platform import get_platform
from pagedllm.utils import native

logger = init_logger(__name__)

_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def to_torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype for a resolved dtype name ("float32", "bfloat16" or "float16")."""
    if dtype not in _TORCH_DTYPES:
        raise ValueError(
            f"dtype must be resolved to one of {', '.join(_TORCH_DTYPES)} before loading; "
            f"got {dtype!r}."
        )
    return _TORCH_DTYPES[dtype]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters in `dtype` inside the block; restore the global default after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def iterate_checkpoint_weights(
    model_config: ModelConfig, dtype: torch.dtype | None = None, keep_codes: bool = False
) -> Iterable[tuple[str, torch.Tensor | GroupCodes]]:
    """HF-named CPU tensors of the configured checkpoint (GGUF file or safetensors folder);
    with `keep_codes`, a GGUF's matrices of the code types (gguf.CODE_TYPES) as their codes
    (GroupCodes)."""
    if model_config.gguf_file is not None:
        path = os.path.join(model_config.model_dir, model_config.gguf_file)
        return iterate_gguf_weights(path, dtype=dtype, keep_codes=keep_codes)
    if model_config.checkpoint_quantization is not None:  # GPTQ / AWQ / compressed-tensors
        # Read as stored: the scales' own bits are kept (the other tensors are cast).
        stored = iterate_safetensors_weights(model_config.model_dir)
        return iterate_weights(model_config.checkpoint_quantization, stored, keep_codes, dtype)
    return iterate_safetensors_weights(model_config.model_dir, dtype=dtype)


def _keeps_file_codes(model_config: ModelConfig, dtype: torch.dtype, device: str) -> bool:
    """Whether the layers take GGUF codes as they are: int4 or int8 weights of a bfloat16
    CPU model run on the byte dot-product kernels (W4A8 / W8A8), which hold the file's codes
    exactly (a Q8_0 file's codes too, rather than re-quantizing them per channel), or of a
    model on the Triton group kernel (GPU)."""
    return get_platform(device).keeps_file_codes(model_config.quantization, dtype)


def process_weights_after_loading(
    model: torch.nn.Module, quantization: str | None, keep_dense: bool = True
) -> None:
    """Let every linear layer and LM head choose its method for `quantization` on its
    platform (layers/quantization/selection.py)."""
    for module in model.modules():
        if isinstance(module, (Linear, LMHead)):
            module.process_weights_after_loading(quantization, keep_dense)


def _model_class(model_config: ModelConfig) -> type:
    """The class the config's runner runs (a pooling checkpoint's own class for pooling)."""
    if model_config.runner == "generate":
        return resolve_model_class(model_config.architecture)
    convert = model_config.convert or "auto"
    return resolve_runner(model_config.architecture, "pooling", convert).model_class


def get_model(model_config: ModelConfig, device: str = "cpu") -> torch.nn.Module:
    """Construct the model on `device` in `model_config.dtype`, load its weights, set eval.

    Raises:
        ValueError: for unsupported architectures or configs, or when the checkpoint leaves
            some parameter unfilled.
    """
    model_class = _model_class(model_config)
    dtype = to_torch_dtype(model_config.dtype)
    with _default_dtype(dtype), torch.device(device):
        model = model_class(model_config.hf_config)
    # Casting on CPU while streaming halves the host memory a float32 dequantized GGUF needs.
    keep_codes = _keeps_file_codes(model_config, dtype, device)
    loaded = model.load_weights(iterate_checkpoint_weights(model_config, dtype, keep_codes))
    check_all_loaded(model, loaded, model_config.hf_config)
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    model.requires_grad_(False)
    model.eval()
    process_weights_after_loading(
        model, model_config.quantization, model_config.keep_dense_weights
    )
    native.release_free_heap()  # the dense weights that quantization or packing replaced
    logger.info(
        "Loaded %s (%s) from %s in %s%s on %s.",
        model_config.architecture,
        model_config.gguf_file or "safetensors",
        model_config.model_dir,
        model_config.dtype,
        f" with {model_config.quantization} weights" if model_config.quantization else "",
        device,
    )
    return model


def check_all_loaded(model: torch.nn.Module, loaded: set[str], hf_config: object) -> None:
    """Raise when a parameter of `model` is absent from `loaded` (a tied lm_head is fine).

    Raises:
        ValueError: listing the unfilled parameter names.
    """
    expected = {name for name, _ in model.named_parameters()}
    missing = expected - set(loaded)
    if getattr(hf_config, "tie_word_embeddings", False):
        missing = {name for name in missing if not name.endswith("lm_head.weight")}
    if missing:
        shown = ", ".join(sorted(missing)[:10])
        more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
        raise ValueError(
            f"The checkpoint left {len(missing)} parameter(s) unfilled: {shown}{more}. The "
            "checkpoint is incomplete or does not match its config's architecture."
        )
