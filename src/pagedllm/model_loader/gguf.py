"""Iterate HF-named float tensors out of a GGUF file.

Maps llama.cpp tensor names to Hugging Face names (llama and qwen2 families), dequantizes any
type the `gguf` package can read (F32/F16/BF16, Q4_0..Q8_0, K-quants, ...) to float32 or the
model's dtype (by chunks of rows, from bytes read rather than memory-mapped), restores
HF's [out, in] shape order, and undoes the Q/K row permutation llama.cpp applies to llama
checkpoints. Config and tokenizer come from transformers' own GGUF support, not from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, BinaryIO

import gguf
import numpy as np
import torch

# Per-block tensor names (llama.cpp → HF), shared by the llama and qwen2 families.
_BLOCK_NAME_MAP = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAME_MAP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors with no HF parameter: llama3 rope factors are rebuilt from the config's rope_scaling.
_SKIPPED_NAMES = frozenset({"rope_freqs.weight"})
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")
# Only llama.cpp's llama converter permutes Q/K rows (qwen2 uses neox rope, left as is).
_PERMUTED_ARCHITECTURES = frozenset({"llama"})

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^(\w+)\.(weight|bias)$")


def gguf_to_hf_name(gguf_name: str) -> str | None:
    """The HF parameter name of a llama/qwen2 GGUF tensor; None for tensors to skip.

    Raises:
        ValueError: for a tensor name this loader does not know.
    """
    if gguf_name in _SKIPPED_NAMES:
        return None
    if (match := _BLOCK_RE.match(gguf_name)) and match.group(2) in _BLOCK_NAME_MAP:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_BLOCK_NAME_MAP[part]}.{kind}"
    if (match := _GLOBAL_RE.match(gguf_name)) and match.group(1) in _GLOBAL_NAME_MAP:
        return f"{_GLOBAL_NAME_MAP[match.group(1)]}.{match.group(2)}"
    raise ValueError(
        f"Unknown GGUF tensor {gguf_name!r}: this loader maps llama/qwen2 GGUF files only."
    )


def _field_value(reader: gguf.GGUFReader, key: str) -> Any:
    """A metadata value (scalar, string or list), or None when the key is absent."""
    field = reader.get_field(key)
    return None if field is None else field.contents()


def read_gguf_architecture(reader: gguf.GGUFReader) -> str:
    """`general.architecture` of the file, checked against the supported families."""
    arch = _field_value(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}."
        )
    return str(arch)


def unpermute_llama_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Invert llama.cpp's Q/K row permutation for `num_heads` heads.

    llama.cpp interleaves the two rotary halves of every head (rows [h, 2, d/2] stored as
    [h, d/2, 2]) for its GPT-J style rope; HF's rotate-half rope needs them back in halves.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads) != 0:
        raise ValueError(f"{rows} rows cannot be split into {num_heads} heads of even size.")
    head_half = rows // num_heads // 2
    # [rows, *rest] → [heads, head_dim/2, 2, *rest] → [heads, 2, head_dim/2, *rest]
    unpermuted = weight.reshape(num_heads, head_half, 2, *weight.shape[1:]).transpose(1, 2)
    return unpermuted.reshape(weight.shape).contiguous()


def _head_count(value: Any, layer: int) -> int:
    """Head counts are scalars, or per-layer lists in some llama.cpp conversions."""
    return int(value[layer]) if isinstance(value, list) else int(value)


# Rows dequantized at a time: a float32 vocabulary matrix and numpy's temporaries for it would
# add several 100 MB to the peak memory of loading.
_DEQUANTIZE_CHUNK_ROWS = 4096


def read_tensor_data(file: BinaryIO, tensor: gguf.ReaderTensor) -> np.ndarray:
    """A tensor's stored bytes, read from `file` into memory of our own, in the shape and
    dtype of the reader's `tensor.data`.

    The reader's arrays are views of its memory map of the whole file: every page read
    through them stays in this process's resident memory while the reader lives (about
    the file's size by the end of loading), while a read copy is freed with the tensor.
    """
    file.seek(int(tensor.data_offset))
    raw = np.fromfile(file, dtype=np.uint8, count=int(tensor.n_bytes))
    return raw.view(tensor.data.dtype).reshape(tensor.data.shape)


def dequantize_tensor(
    tensor: gguf.ReaderTensor, dtype: torch.dtype | None = None, data: np.ndarray | None = None
) -> torch.Tensor:
    """A GGUF tensor as `dtype` (default float32) in HF shape order (GGUF lists dimensions
    innermost first), dequantized by chunks of rows from `data` (default: `tensor.data`)."""
    shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
    out = torch.empty(shape, dtype=dtype or torch.float32)
    rows = out.view(-1, shape[-1]) if out.dim() > 1 else out.view(1, -1)
    data = (tensor.data if data is None else data).reshape(rows.shape[0], -1)
    for start in range(0, rows.shape[0], _DEQUANTIZE_CHUNK_ROWS):
        chunk = slice(start, start + _DEQUANTIZE_CHUNK_ROWS)
        try:
            array = gguf.quants.dequantize(data[chunk], tensor.tensor_type)
        except NotImplementedError as e:
            raise ValueError(
                f"GGUF tensor {tensor.name!r} uses {tensor.tensor_type.name}, which the "
                "installed gguf package cannot dequantize; re-quantize the model (e.g. Q4_K_M "
                "or Q8_0)."
            ) from e
        array = np.asarray(array, dtype=np.float32)
        if not array.flags.writeable:  # float types: a view of the file's memory map
            array = array.copy()
        rows[chunk] = torch.from_numpy(array).reshape(-1, rows.shape[1])
    return out


# GGUF block types by the weight-only method that holds them without (much) loss: 4-bit
# types re-quantize to int4 in groups of 32 (Q4_1 exactly), wider ones to int8 per channel.
_INT4_TYPES = {"Q4_0", "Q4_1", "Q4_K"}
_INT8_TYPES = {"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_K"}


def gguf_weight_quantization(gguf_path: str) -> str | None:
    """The weight-only method matching a GGUF's decoder-layer matrices, or None.

    "int4" when all are 4-bit, "int8" when all are quantized and some are wider, None when
    any is a float type (F32/F16/BF16): such files are served with dense weights.
    """
    reader = gguf.GGUFReader(gguf_path)
    types = {
        tensor.tensor_type.name
        for tensor in reader.tensors
        if tensor.name.startswith("blk.") and len(tensor.shape) == 2
    }
    if types and types <= _INT4_TYPES:
        return "int4"
    if types and types <= _INT4_TYPES | _INT8_TYPES:
        return "int8"
    return None


def iterate_gguf_weights(
    gguf_path: str, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) for every weight of a llama/qwen2 GGUF file.

    Tensors are float32 (or `dtype` when given). A tied model has no
    "output.weight", so no "lm_head.weight" is yielded for it.
    """
    reader = gguf.GGUFReader(gguf_path)
    arch = read_gguf_architecture(reader)
    num_heads = _field_value(reader, f"{arch}.attention.head_count")
    num_kv_heads = _field_value(reader, f"{arch}.attention.head_count_kv")
    if num_kv_heads is None:
        num_kv_heads = num_heads
    with open(gguf_path, "rb") as file:
        for tensor in reader.tensors:
            hf_name = gguf_to_hf_name(tensor.name)
            if hf_name is None:
                continue
            # In the target dtype from the start: the row permutation below is exact in any.
            weight = dequantize_tensor(tensor, dtype, read_tensor_data(file, tensor))
            if arch in _PERMUTED_ARCHITECTURES:
                weight = _maybe_unpermute(hf_name, weight, num_heads, num_kv_heads)
            yield hf_name, weight


def _maybe_unpermute(
    hf_name: str, weight: torch.Tensor, num_heads: Any, num_kv_heads: Any
) -> torch.Tensor:
    """Undo the permutation on q_proj/k_proj tensors (weights and, if present, biases)."""
    match = re.match(r"model\.layers\.(\d+)\.self_attn\.([qk])_proj\.", hf_name)
    if match is None:
        return weight
    layer = int(match.group(1))
    heads = num_heads if match.group(2) == "q" else num_kv_heads
    return unpermute_llama_rows(weight, _head_count(heads, layer))
