"""Iterate HF-named weights out of a GGUF file.

Maps llama.cpp tensor names to Hugging Face names (llama and qwen2 families), dequantizes any
type the `gguf` package can read (F32/F16/BF16, Q4_0..Q8_0, K-quants, ...) to float32 or the
model's dtype (by chunks of rows, from bytes read rather than memory-mapped), restores
HF's [out, in] shape order, and undoes the Q/K row permutation llama.cpp applies to llama
checkpoints. Asked to, it hands Q4_0, Q4_1 and Q8_0 matrices over as their codes and scales
(`GroupCodes`) instead, which the byte dot-product kernels use as they are. Tensors are
found through the file's cached index (gguf_cache.py); config and tokenizer come from
transformers' own GGUF support, converted once per file there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

import gguf
import numpy as np
import torch

from pagedllm.layers.quantization import GroupCodes
from pagedllm.model_loader.gguf_cache import GgufTensorInfo, load_index
from pagedllm.model_loader.k_quants import K_QUANT_DECODERS, float16_at

# Per-block tensor names (llama.cpp → HF), shared by the families; _ARCH_BLOCK_NAMES
# adds or overrides entries per architecture.
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
# Experts are stacked in one 3D tensor per projection: split per expert ({expert}).
_MOE_NAMES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.{expert}.gate_proj",
    "ffn_up_exps": "mlp.experts.{expert}.up_proj",
    "ffn_down_exps": "mlp.experts.{expert}.down_proj",
}
_ARCH_BLOCK_NAMES: dict[str, dict[str, str]] = {
    # Mixtral is written as "llama" with experts (HF's Mixtral names; the model renames).
    "llama": {
        "ffn_gate_inp": "block_sparse_moe.gate",
        "ffn_gate_exps": "block_sparse_moe.experts.{expert}.w1",
        "ffn_up_exps": "block_sparse_moe.experts.{expert}.w3",
        "ffn_down_exps": "block_sparse_moe.experts.{expert}.w2",
    },
    "qwen3": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    # Phi-3 keeps HF's fused q/k/v and gate/up (gate rows first) as they are.
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "qwen2moe": {
        **_MOE_NAMES,
        "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
        "ffn_up_shexp": "mlp.shared_expert.up_proj",
        "ffn_down_shexp": "mlp.shared_expert.down_proj",
        "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    },
    # GPT-2's matrices are stored [out, in] (llama.cpp transposed the Conv1D weights): our
    # parameter names directly, which the model takes as they are.
    "gpt2": {
        "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"
    },
    "qwen3moe": {
        **_MOE_NAMES, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"
    },
    # Gemma 3's four norms per block: ffn_norm is the one before the MLP.
    "gemma3": {
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
_GLOBAL_NAME_MAP = {
    "token_embd": "model.embed_tokens",
    "position_embd": "model.embed_positions",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors with no HF parameter: llama3 rope factors are rebuilt from the config's rope_scaling.
_SKIPPED_NAMES = frozenset({"rope_freqs.weight"})
SUPPORTED_GGUF_ARCHITECTURES = (
    "llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen2moe", "qwen3moe", "gpt2"
)
# LongRoPE factor tensors: transformers' GGUF config conversion drops the rope scaling they
# belong to, so such a file would silently run without it past the original length.
_UNSUPPORTED_NAMES = frozenset({"rope_factors_long.weight", "rope_factors_short.weight"})
# llama.cpp stores Gemma's (1 + w) norm weights with the 1 added: HF's w is the stored - 1.
_ONE_PLUS_NORM_ARCHITECTURES = frozenset({"gemma3"})
# Only llama.cpp's llama converter permutes Q/K rows (qwen2 uses neox rope, left as is).
_PERMUTED_ARCHITECTURES = frozenset({"llama"})

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^(\w+)\.(weight|bias)$")


def gguf_to_hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The HF parameter name of a GGUF tensor of architecture `arch`; None to skip it.

    Raises:
        ValueError: for a tensor name this loader does not know.
    """
    if gguf_name in _SKIPPED_NAMES:
        return None
    if gguf_name in _UNSUPPORTED_NAMES:
        raise ValueError(
            f"GGUF tensor {gguf_name!r}: LongRoPE factors in a GGUF file are not supported "
            "yet (load the model's Hugging Face folder instead)."
        )
    block_names = {**_BLOCK_NAME_MAP, **_ARCH_BLOCK_NAMES.get(arch, {})}
    if (match := _BLOCK_RE.match(gguf_name)) and match.group(2) in block_names:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{block_names[part]}.{kind}"
    if (match := _GLOBAL_RE.match(gguf_name)) and match.group(1) in _GLOBAL_NAME_MAP:
        return f"{_GLOBAL_NAME_MAP[match.group(1)]}.{match.group(2)}"
    raise ValueError(
        f"Unknown GGUF tensor {gguf_name!r} for architecture {arch!r}: this loader maps "
        f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)} GGUF files."
    )


def check_architecture(arch: str) -> str:
    """`general.architecture` of a file, checked against the supported families."""
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}."
        )
    return arch


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


def read_tensor_data(file: BinaryIO, tensor: GgufTensorInfo) -> np.ndarray:
    """A tensor's stored bytes, read from `file` into memory of our own, in the shape and
    dtype `gguf.quants.dequantize` takes (uint8 blocks per row for quantized types).

    Read, not memory-mapped: every page read through a map of the whole file would stay in
    this process's resident memory while the map lives, a read copy is freed with the tensor.
    """
    file.seek(tensor.offset)
    raw = np.fromfile(file, dtype=np.uint8, count=tensor.n_bytes)
    return raw.view(np.dtype(tensor.data_dtype)).reshape(tensor.data_shape)


def dequantize_tensor(
    tensor: GgufTensorInfo, data: np.ndarray, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A GGUF tensor as `dtype` (default float32) in HF shape order (GGUF lists dimensions
    innermost first), dequantized by chunks of rows from its bytes `data`."""
    shape = tuple(reversed(tensor.shape))
    out = torch.empty(shape, dtype=dtype or torch.float32)
    rows = out.view(-1, shape[-1]) if out.dim() > 1 else out.view(1, -1)
    data = data.reshape(rows.shape[0], -1)
    qtype = gguf.GGMLQuantizationType[tensor.type_name]
    for start in range(0, rows.shape[0], _DEQUANTIZE_CHUNK_ROWS):
        chunk = slice(start, start + _DEQUANTIZE_CHUNK_ROWS)
        try:
            array = gguf.quants.dequantize(data[chunk], qtype)
        except NotImplementedError as e:
            raise ValueError(
                f"GGUF tensor {tensor.name!r} uses {tensor.type_name}, which the "
                "installed gguf package cannot dequantize; re-quantize the model (e.g. Q4_K_M "
                "or Q8_0)."
            ) from e
        array = np.asarray(array, dtype=np.float32)
        if not array.flags.writeable:  # float types: a view of the bytes read
            array = array.copy()
        rows[chunk] = torch.from_numpy(array).reshape(-1, rows.shape[1])
    return out


# Block types kept as codes: (bytes per block of 32, has a minimum, 4-bit).
_CODE_BLOCKS = {"Q4_0": (18, False, True), "Q4_1": (20, True, True), "Q8_0": (34, False, False)}
# Types whose codes are rearranged into GroupCodes without changing a value (k_quants.py
# for the K-quants' super-blocks).
CODE_TYPES = frozenset({*_CODE_BLOCKS, "Q5_0", "Q4_K", "Q5_K", "Q6_K"})


def group_codes(tensor: GgufTensorInfo, data: np.ndarray) -> GroupCodes:
    """A matrix's codes and scales (CODE_TYPES), exactly as stored (HF row order).

    Q4_0 blocks are (d, 16 bytes), w = d * (q - 8); Q4_1 (d, m, 16 bytes), w = d * q + m; a
    byte holds value j in its low nibble and value j + 16 in its high one. Q8_0 blocks are
    (d, 32 int8 codes), w = d * q. d and m are float16, exact in float32.
    """
    rows = math.prod(tensor.shape[1:])  # all experts' rows for a stacked 3D tensor
    if tensor.type_name in K_QUANT_DECODERS:
        return K_QUANT_DECODERS[tensor.type_name](data.reshape(rows, -1))
    block_bytes, has_min, four_bit = _CODE_BLOCKS[tensor.type_name]
    blocks = data.reshape(rows, -1, block_bytes)  # [rows, groups, block_bytes]
    scales = float16_at(blocks, 0)
    if not four_bit:
        signed = torch.from_numpy(blocks[..., 2:].copy().view(np.int8))
        return GroupCodes(signed, torch.from_numpy(scales), None)
    packed = blocks[..., 4 if has_min else 2 :]
    nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # [rows, groups, 32]
    mins = float16_at(blocks, 2) if has_min else -8.0 * scales
    return GroupCodes(torch.from_numpy(nibbles), torch.from_numpy(scales), torch.from_numpy(mins))


# GGUF block types by the weight-only method that holds them without (much) loss: 4-bit
# types re-quantize to int4 in groups of 32 (Q4_1 exactly), wider ones to int8 per channel.
_INT4_TYPES = {"Q4_0", "Q4_1", "Q4_K"}
_INT8_TYPES = {"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_K"}
# MoE routers (the experts' and the shared expert's gate): RouterLinear, never quantized.
_ROUTER_NAMES = frozenset({"ffn_gate_inp", "ffn_gate_inp_shexp"})


def gguf_weight_quantization(gguf_path: str) -> str | None:
    """The weight-only method matching a GGUF's decoder-layer matrices, or None.

    "int4" when all are 4-bit, or when some are and every one is of a type whose codes the
    byte dot-product kernels take as they are (CODE_TYPES: a mixed Q4_K_M file keeps each
    tensor's own format); "int8" when all are quantized and some are wider; None when any
    is a float type (F32/F16/BF16): such files are served with dense weights. Experts'
    stacked 3D matrices count; MoE routers do not (llama.cpp keeps them float32 in every
    file, and the model runs them as plain float matmuls whatever the method).
    """
    types = {
        tensor.type_name
        for tensor in load_index(gguf_path).tensors
        if tensor.name.startswith("blk.")
        and len(tensor.shape) in (2, 3)
        and tensor.name.split(".")[2] not in _ROUTER_NAMES
    }
    if types and (types <= _INT4_TYPES or (types <= CODE_TYPES and types & _INT4_TYPES)):
        return "int4"
    if types and types <= _INT4_TYPES | _INT8_TYPES:
        return "int8"
    return None


def iterate_gguf_weights(
    gguf_path: str, dtype: torch.dtype | None = None, keep_codes: bool = False
) -> Iterator[tuple[str, torch.Tensor | GroupCodes]]:
    """Yield (HF name, tensor) for every weight of a GGUF file of a supported architecture.

    Tensors are float32 (or `dtype` when given); with `keep_codes`, Q4_0 / Q4_1 / Q8_0
    matrices come as GroupCodes instead. A tied model has no "output.weight", so no
    "lm_head.weight" is yielded for it.
    """
    index = load_index(gguf_path)
    arch = check_architecture(index.architecture)
    num_heads = index.metadata["attention.head_count"]
    num_kv_heads = index.metadata["attention.head_count_kv"]
    if num_kv_heads is None:
        num_kv_heads = num_heads
    with open(gguf_path, "rb") as file:
        for tensor in index.tensors:
            hf_name = gguf_to_hf_name(tensor.name, arch)
            if hf_name is None:
                continue
            data = read_tensor_data(file, tensor)
            weight: torch.Tensor | GroupCodes
            if keep_codes and tensor.type_name in CODE_TYPES and len(tensor.shape) in (2, 3):
                weight = group_codes(tensor, data)
            elif arch in _ONE_PLUS_NORM_ARCHITECTURES and hf_name.endswith("norm.weight"):
                weight = dequantize_tensor(tensor, data) - 1.0  # float32: the model adds 1
            else:  # in the target dtype from the start: the row permutation is exact in any
                weight = dequantize_tensor(tensor, data, dtype)
            if arch in _PERMUTED_ARCHITECTURES:
                weight = _maybe_unpermute(hf_name, weight, num_heads, num_kv_heads)
            if "{expert}" in hf_name:
                yield from _split_experts(hf_name, weight, num_experts=tensor.shape[-1])
            elif isinstance(weight, torch.Tensor) and weight.dim() == 1 and hf_name.endswith(
                "shared_expert_gate.weight"
            ):
                yield hf_name, weight.unsqueeze(0)  # llama.cpp drops HF's output dimension
            else:
                yield hf_name, weight


def _split_experts(
    hf_name: str, weight: torch.Tensor | GroupCodes, num_experts: int
) -> Iterator[tuple[str, torch.Tensor | GroupCodes]]:
    """One (name, matrix) per expert of a stacked [experts, rows, cols] tensor (dense, or
    codes whose rows run expert after expert)."""
    for expert in range(num_experts):
        name = hf_name.format(expert=expert)
        if isinstance(weight, GroupCodes):
            rows = weight.shape[0] // num_experts
            start = expert * rows

            def expert_rows(t: torch.Tensor, start: int = start, rows: int = rows) -> torch.Tensor:
                return t[start : start + rows].contiguous()

            yield name, weight.map_rows(expert_rows)
        else:
            yield name, weight[expert]


def _maybe_unpermute(
    hf_name: str, weight: torch.Tensor | GroupCodes, num_heads: Any, num_kv_heads: Any
) -> torch.Tensor | GroupCodes:
    """Undo the permutation on q_proj/k_proj tensors (weights and, if present, biases)."""
    match = re.match(r"model\.layers\.(\d+)\.self_attn\.([qk])_proj\.", hf_name)
    if match is None:
        return weight
    layer = int(match.group(1))
    heads = _head_count(num_heads if match.group(2) == "q" else num_kv_heads, layer)
    if isinstance(weight, GroupCodes):
        return weight.map_rows(lambda rows: unpermute_llama_rows(rows, heads))
    return unpermute_llama_rows(weight, heads)
