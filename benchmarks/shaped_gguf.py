"""Random-weight Q4_0 GGUF files at real model shapes, one file for every engine.

Speed does not depend on the weights' values, and no Qwen3 or Qwen2-MoE GGUF installs from
the package registries; so this writes files with the real shapes and random codes, which
pagedllm and llama.cpp then both load (`latency.py --model FILE --compare llamacpp`):

    python benchmarks/shaped_gguf.py qwen3-0.6b /tmp/shaped/qwen3-0.6b.gguf
    python benchmarks/shaped_gguf.py qwen2-moe /tmp/shaped/qwen2-moe.gguf --layers 8

Every 2-D and expert matrix is Q4_0 (random 4-bit codes, one fp16 scale per 32 values, about
the spread of transformers' 0.02-std initialisation); an untied output head is Q8_0 (the
gguf package cannot write llama.cpp's default Q6_K head); norms, the router and biases are
float32. The tokenizer is the default model's (SmolLM2's BPE) with unused tokens appended
up to the shape's vocabulary size, so the embedding and head have the real row counts.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# A Q4_0 block: one fp16 scale, then 32 4-bit codes (value = scale * (code - 8)).
Q4_0_BLOCK_BYTES = 18
# Q8_0: one fp16 scale, then 32 int8 codes.
Q8_0_BLOCK_BYTES = 34
# llama.cpp's token type for a vocabulary slot nothing produces.
TOKEN_TYPE_UNUSED = 5


@dataclass(frozen=True)
class Shape:
    """A model's dimensions as its GGUF metadata states them."""

    arch: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rope_base: float
    tied_head: bool
    qk_norm: bool = False
    qkv_bias: bool = False
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0


SHAPES = {
    # Qwen/Qwen3-0.6B's config.json.
    "qwen3-0.6b": Shape(
        arch="qwen3", layers=28, hidden=1024, ffn=3072, heads=16, kv_heads=8, head_dim=128,
        vocab=151936, context=40960, rope_base=1e6, tied_head=True, qk_norm=True,
    ),
    # Qwen/Qwen1.5-MoE-A2.7B's config.json (Qwen2-MoE): 60 experts, 4 used, a shared expert.
    "qwen2-moe": Shape(
        arch="qwen2moe", layers=24, hidden=2048, ffn=5632, heads=16, kv_heads=16,
        head_dim=128, vocab=151936, context=8192, rope_base=1e6, tied_head=False,
        qkv_bias=True, experts=60, experts_used=4, expert_ffn=1408, shared_ffn=5632,
    ),
}


def random_q4_0(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Raw Q4_0 blocks for a float tensor of `shape` (last dim a multiple of 32)."""
    *outer, cols = shape
    blocks = int(np.prod(outer, dtype=np.int64)) * (cols // 32)
    raw = rng.integers(0, 256, size=(blocks, Q4_0_BLOCK_BYTES), dtype=np.uint8)
    # Uniform codes 0..15 around 8 have std ~4.6: a scale of 0.0044 gives std ~0.02.
    scales = rng.uniform(0.003, 0.006, size=blocks).astype(np.float16)
    raw[:, :2] = scales.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(*outer, (cols // 32) * Q4_0_BLOCK_BYTES)


def random_q8_0(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Raw Q8_0 blocks for a float matrix of `shape` (std ~0.02)."""
    rows, cols = shape
    blocks = rows * (cols // 32)
    raw = rng.integers(0, 256, size=(blocks, Q8_0_BLOCK_BYTES), dtype=np.uint8)
    scales = np.full(blocks, 0.02 / 73.0, dtype=np.float16)  # int8 uniform: std ~73
    raw[:, :2] = scales.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(rows, (cols // 32) * Q8_0_BLOCK_BYTES)


def _copy_tokenizer(writer: Any, vocab: int) -> None:
    """The default model's tokenizer, its vocabulary padded with unused tokens to `vocab`."""
    import gguf
    from common import default_model_path

    reader = gguf.GGUFReader(default_model_path())

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    if len(tokens) > vocab:
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {len(tokens)}")
    extra = vocab - len(tokens)
    tokens += [f"<|unused_{i}|>" for i in range(extra)]
    types += [TOKEN_TYPE_UNUSED] * extra
    writer.add_tokenizer_model(field("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(field("tokenizer.ggml.merges")))
    writer.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    writer.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    writer.add_pad_token_id(int(field("tokenizer.ggml.padding_token_id")))
    writer.add_add_bos_token(False)
    writer.add_chat_template(field("tokenizer.chat_template"))


def _add_metadata(writer: Any, shape: Shape) -> None:
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_file_type(2)  # llama.cpp's MOSTLY_Q4_0
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.expert_ffn)
        writer.add_expert_shared_feed_forward_length(shape.shared_ffn)


def layer_tensors(shape: Shape, rng: np.random.Generator, i: int) -> dict[str, np.ndarray]:
    """Block `i`'s tensors by GGUF name: raw uint8 Q4_0 blocks or float32 values."""
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    h = shape.hidden
    out: dict[str, np.ndarray] = {
        "attn_norm.weight": np.ones(h, np.float32),
        "ffn_norm.weight": np.ones(h, np.float32),
        "attn_q.weight": random_q4_0(rng, (q_rows, h)),
        "attn_k.weight": random_q4_0(rng, (kv_rows, h)),
        "attn_v.weight": random_q4_0(rng, (kv_rows, h)),
        "attn_output.weight": random_q4_0(rng, (h, q_rows)),
    }
    if shape.qk_norm:
        out["attn_q_norm.weight"] = np.ones(shape.head_dim, np.float32)
        out["attn_k_norm.weight"] = np.ones(shape.head_dim, np.float32)
    if shape.qkv_bias:
        for name, rows in (("attn_q", q_rows), ("attn_k", kv_rows), ("attn_v", kv_rows)):
            out[f"{name}.bias"] = rng.normal(0, 0.02, rows).astype(np.float32)
    if not shape.experts:
        out["ffn_gate.weight"] = random_q4_0(rng, (shape.ffn, h))
        out["ffn_up.weight"] = random_q4_0(rng, (shape.ffn, h))
        out["ffn_down.weight"] = random_q4_0(rng, (h, shape.ffn))
        return out
    e, f = shape.experts, shape.expert_ffn
    out["ffn_gate_inp.weight"] = rng.normal(0, 0.02, (e, h)).astype(np.float32)
    out["ffn_gate_exps.weight"] = random_q4_0(rng, (e, f, h))
    out["ffn_up_exps.weight"] = random_q4_0(rng, (e, f, h))
    out["ffn_down_exps.weight"] = random_q4_0(rng, (e, h, f))
    out["ffn_gate_inp_shexp.weight"] = rng.normal(0, 0.02, h).astype(np.float32)
    out["ffn_gate_shexp.weight"] = random_q4_0(rng, (shape.shared_ffn, h))
    out["ffn_up_shexp.weight"] = random_q4_0(rng, (shape.shared_ffn, h))
    out["ffn_down_shexp.weight"] = random_q4_0(rng, (h, shape.shared_ffn))
    return out


def _add(writer: Any, name: str, values: np.ndarray, qtype: Any) -> None:
    if values.dtype == np.uint8:
        writer.add_tensor(name, values, raw_dtype=qtype)
    else:
        writer.add_tensor(name, values)


def write_shaped_gguf(shape: Shape, path: Path, seed: int = 0) -> Path:
    """Write a random-weight Q4_0 GGUF with `shape`'s dimensions to `path`."""
    import gguf

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), shape.arch)
    _add_metadata(writer, shape)
    _copy_tokenizer(writer, shape.vocab)
    q4 = gguf.GGMLQuantizationType.Q4_0
    _add(writer, "token_embd.weight", random_q4_0(rng, (shape.vocab, shape.hidden)), q4)
    for i in range(shape.layers):
        for name, values in layer_tensors(shape, rng, i).items():
            _add(writer, f"blk.{i}.{name}", values, q4)
    _add(writer, "output_norm.weight", np.ones(shape.hidden, np.float32), q4)
    if not shape.tied_head:
        head = random_q8_0(rng, (shape.vocab, shape.hidden))
        _add(writer, "output.weight", head, gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("output", type=Path, help="the .gguf file to write")
    parser.add_argument("--layers", type=int, default=None,
                        help="fewer blocks than the real model (same per-block shapes)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    if args.layers is not None:
        if args.layers < 1:
            parser.error("--layers must be at least 1")
        shape = Shape(**{**shape.__dict__, "layers": args.layers})
    start = time.perf_counter()
    write_shaped_gguf(shape, args.output, args.seed)
    size = args.output.stat().st_size / 1e6
    print(f"{args.shape} ({shape.layers} blocks) -> {args.output}: {size:.0f} MB "
          f"in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
