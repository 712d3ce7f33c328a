"""GGUF tensor iteration: name map, dequantization per type, llama Q/K un-permutation.

Tiny GGUF files are written with gguf.GGUFWriter. Types the gguf package can quantize
(F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are checked against the originals within each
format's rounding error. The package cannot quantize K-quants, so Q4_K/Q5_K/Q6_K blocks are
built by hand with known decoded values. The default model is compared with transformers.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file

from pagedllm.model_loader.gguf import (
    gguf_to_hf_name,
    iterate_gguf_weights,
    unpermute_llama_rows,
)
from tests.conftest import default_gguf_path


def _write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, Q]], **meta) -> Path:
    """Write `tensors` ({name: (float32 values or raw block bytes, type)}) to a GGUF file."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(meta.get("layers", 1))
    writer.add_context_length(meta.get("context", 128))
    writer.add_embedding_length(meta.get("hidden", 64))
    writer.add_feed_forward_length(meta.get("ffn", 128))
    writer.add_head_count(meta.get("heads", 4))
    writer.add_head_count_kv(meta.get("kv_heads", 2))
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if "vocab" in meta:
        writer.add_vocab_size(meta["vocab"])
    if "experts" in meta:  # mixture of experts
        writer.add_expert_count(meta["experts"])
        writer.add_expert_used_count(meta["experts_used"])
        writer.add_expert_feed_forward_length(meta["expert_ffn"])
        if "shared_ffn" in meta:
            writer.add_expert_shared_feed_forward_length(meta["shared_ffn"])
    if "key_length" in meta:
        writer.add_key_length(meta["key_length"])
        writer.add_value_length(meta["key_length"])
    for name, (values, qtype) in tensors.items():
        if values.dtype == np.uint8:  # hand-built raw blocks
            writer.add_tensor(name, values, raw_dtype=qtype)
        elif qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, values.astype(np.float32 if qtype == Q.F32 else np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_name_map() -> None:
    assert gguf_to_hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_to_hf_name("output.weight") == "lm_head.weight"
    assert gguf_to_hf_name("output_norm.weight") == "model.norm.weight"
    assert gguf_to_hf_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert gguf_to_hf_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert gguf_to_hf_name("blk.3.ffn_gate.weight") == "model.layers.3.mlp.gate_proj.weight"
    assert gguf_to_hf_name("blk.3.ffn_norm.weight") == (
        "model.layers.3.post_attention_layernorm.weight"
    )
    assert gguf_to_hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="blk.0.ssm_conv"):
        gguf_to_hf_name("blk.0.ssm_conv.weight")


# (type, error bound as a multiple of each 32-value block's max |x|)
_QUANTIZABLE = [
    (Q.F32, 0.0),
    (Q.F16, 1e-3),
    (Q.BF16, 1 / 128),
    (Q.Q8_0, 1 / 127),
    (Q.Q4_0, 1 / 8),
    (Q.Q4_1, 1 / 15),
    (Q.Q5_0, 1 / 16),
    (Q.Q5_1, 1 / 31),
]


@pytest.mark.parametrize(("qtype", "bound"), _QUANTIZABLE, ids=lambda v: getattr(v, "name", ""))
def test_dequantize_within_format_error(tmp_path: Path, qtype: Q, bound: float) -> None:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((48, 64)).astype(np.float32)  # HF [out, in]
    path = _write_gguf(tmp_path / "t.gguf", "qwen2", {"blk.0.ffn_down.weight": (values, qtype)})
    [(name, tensor)] = list(iterate_gguf_weights(str(path)))
    assert name == "model.layers.0.mlp.down_proj.weight"
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == (48, 64)
    error = np.abs(tensor.numpy() - values).reshape(-1, 32)
    block_max = np.abs(values).reshape(-1, 32).max(axis=1, keepdims=True)
    assert np.all(error <= bound * block_max + 1e-6)


def _k_quant_block(qtype: Q) -> tuple[np.ndarray, np.ndarray]:
    """One hand-built 256-value super-block of `qtype` and the values it must decode to."""
    d = np.array([1.0], dtype=np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        # ql, qh all zero → 6-bit q = 0 → value = d * scale * (q - 32) = -32 * scale.
        scales = np.arange(1, 17, dtype=np.int8).view(np.uint8)
        block = np.concatenate([np.zeros(192, np.uint8), scales, d])
        return block, -32.0 * np.repeat(np.arange(1, 17, dtype=np.float32), 16)
    # Q4_K / Q5_K: d, dmin=0, 6-bit scales all 1 with mins 0, nibbles 3 (low) and 5 (high).
    dmin = np.zeros(2, np.uint8)
    scales = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)
    qh = [np.zeros(32, np.uint8)] if qtype == Q.Q5_K else []
    qs = np.full(128, 0x53, np.uint8)
    block = np.concatenate([d, dmin, scales, *qh, qs])
    expected = np.tile(np.repeat(np.array([3.0, 5.0], np.float32), 32), 4)
    return block, expected


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quants_decode_known_blocks(tmp_path: Path, qtype: Q) -> None:
    block, expected = _k_quant_block(qtype)
    assert block.size == gguf.GGML_QUANT_SIZES[qtype][1]
    raw = np.tile(block, (3, 2))  # 3 rows of 2 super-blocks → HF shape [3, 512]
    path = _write_gguf(tmp_path / "k.gguf", "qwen2", {"blk.1.ffn_up.weight": (raw, qtype)})
    [(name, tensor)] = list(iterate_gguf_weights(str(path)))
    assert name == "model.layers.1.mlp.up_proj.weight"
    assert tuple(tensor.shape) == (3, 512)
    assert np.array_equal(tensor.numpy(), np.tile(expected, (3, 2)))


def _llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter layout: each head's two rotary halves interleaved row by row."""
    rows = weight.shape[0]
    split = weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    weight = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    permuted = torch.from_numpy(_llama_cpp_permute(weight, 8))
    assert np.array_equal(unpermute_llama_rows(permuted, 8).numpy(), weight)
    with pytest.raises(ValueError, match="cannot be split"):
        unpermute_llama_rows(torch.zeros(6, 2), 4)


def _tiny_llama_gguf(tmp_path: Path, tiny_llama_dir: Path) -> tuple[Path, dict]:
    """The tiny Llama checkpoint as an F32 GGUF in llama.cpp's layout (Q/K rows permuted)."""
    hf = {k: v.numpy() for k, v in load_file(tiny_llama_dir / "model.safetensors").items()}
    inverse = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for layer in range(2):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                     "ffn_down", "attn_norm", "ffn_norm"):  # fmt: skip
            gguf_name = f"blk.{layer}.{part}.weight"
            inverse[gguf_to_hf_name(gguf_name)] = gguf_name
    tensors = {}
    for hf_name, values in hf.items():
        if hf_name.endswith("q_proj.weight"):
            values = _llama_cpp_permute(values, 4)
        elif hf_name.endswith("k_proj.weight"):
            values = _llama_cpp_permute(values, 2)
        tensors[inverse[hf_name]] = (values, Q.F32)
    meta = dict(layers=2, hidden=64, ffn=128, heads=4, kv_heads=2, vocab=hf[
        "model.embed_tokens.weight"].shape[0], context=1024)  # fmt: skip
    return _write_gguf(tmp_path / "tiny.gguf", "llama", tensors, **meta), hf


def test_tiny_llama_gguf_round_trip(tmp_path: Path, tiny_llama_dir: Path) -> None:
    path, hf = _tiny_llama_gguf(tmp_path, tiny_llama_dir)
    got = dict(iterate_gguf_weights(str(path)))
    assert got.keys() == hf.keys()
    for name, values in hf.items():
        assert np.array_equal(got[name].numpy(), values), name
    bf16 = dict(iterate_gguf_weights(str(path), dtype=torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    values = np.zeros((4, 32), np.float32)
    path = _write_gguf(tmp_path / "x.gguf", "gemma", {"output_norm.weight": (values, Q.F32)})
    with pytest.raises(ValueError, match="'gemma' is not supported"):
        list(iterate_gguf_weights(str(path)))


def test_default_model_matches_transformers(default_model_hf) -> None:
    path = default_gguf_path()
    assert path is not None  # else the fixture skipped
    ours = dict(iterate_gguf_weights(str(path)))
    reference = default_model_hf.state_dict()
    # Tied embeddings: the GGUF has no output.weight, transformers shares embed_tokens.
    assert set(reference) - set(ours) == {"lm_head.weight"}
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, reference[name]), name


def test_get_model_from_gguf(monkeypatch, tmp_path: Path, tiny_llama_dir: Path) -> None:
    from pagedllm.model_loader import loader
    from tests.model_loader.test_safetensors import _HFNamedLlama, _model_config

    path, hf = _tiny_llama_gguf(tmp_path, tiny_llama_dir)
    monkeypatch.setattr(loader, "resolve_model_class", lambda arch: _HFNamedLlama)
    config = _model_config(tmp_path, "float32", gguf_file=path.name)
    assert config.architecture == "LlamaForCausalLM"
    assert config.hf_config.num_key_value_heads == 2
    model = loader.get_model(config)
    for name, param in model.named_parameters():
        assert np.array_equal(param.numpy(), hf[name]), name


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_file_codes_decode_as_the_gguf_package_dequantizes(tmp_path: Path, qtype: Q) -> None:
    """GroupCodes hold the file's own codes and scales: their dense form is exactly what
    gguf's dequantization gives, and they repack into W4A8/W8A8 losslessly."""
    from pagedllm.layers.quantization import (
        GroupCodes,
        can_quantize_w4a8,
        w4a8_from_codes,
        w8a8_from_codes,
    )

    values = np.random.default_rng(1).standard_normal((40, 96)).astype(np.float32)
    path = _write_gguf(tmp_path / "c.gguf", "qwen2", {"blk.0.ffn_down.weight": (values, qtype)})
    [(_, dense)] = list(iterate_gguf_weights(str(path)))
    [(name, codes)] = list(iterate_gguf_weights(str(path), keep_codes=True))
    assert name == "model.layers.0.mlp.down_proj.weight" and isinstance(codes, GroupCodes)
    assert codes.shape == (40, 96) and codes.is_int4 == (qtype != Q.Q8_0)
    assert torch.equal(codes.dense(torch.float32), dense)
    if can_quantize_w4a8(torch.empty(40, 96, dtype=torch.bfloat16)):
        packed = w4a8_from_codes(codes) if codes.is_int4 else w8a8_from_codes(codes)
        assert torch.equal(packed.dense(torch.float32), dense)


def test_llama_rows_are_unpermuted_on_codes_too(tmp_path: Path) -> None:
    values = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    permuted = _llama_cpp_permute(values, 4)
    path = _write_gguf(tmp_path / "p.gguf", "llama", {"blk.0.attn_q.weight": (permuted, Q.Q4_1)})
    [(_, dense)] = list(iterate_gguf_weights(str(path)))
    [(_, codes)] = list(iterate_gguf_weights(str(path), keep_codes=True))
    assert torch.equal(codes.dense(torch.float32), dense)
    assert np.abs(dense.numpy() - values).max() < 0.2  # un-permuted: close to the original


def test_tensor_index_is_cached_per_file(tmp_path: Path, monkeypatch) -> None:
    """The second read of a file builds no GGUFReader; a rewritten file is read again."""
    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path / "cache"))
    values = np.ones((16, 32), np.float32)
    path = _write_gguf(tmp_path / "i.gguf", "qwen2", {"blk.0.ffn_up.weight": (values, Q.F32)})
    first = dict(iterate_gguf_weights(str(path)))

    def no_reader(*args, **kwargs):
        raise AssertionError("the cached index should be used")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    assert torch.equal(dict(iterate_gguf_weights(str(path)))["model.layers.0.mlp.up_proj.weight"],
                       first["model.layers.0.mlp.up_proj.weight"])
    monkeypatch.undo()
    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path / "cache"))
    _write_gguf(path, "qwen2", {"blk.0.ffn_up.weight": (2 * values, Q.F32)})
    import os

    os.utime(path, ns=(1, 1))  # a different modification time: a different cache entry
    [(_, tensor)] = list(iterate_gguf_weights(str(path)))
    assert torch.equal(tensor, 2 * first["model.layers.0.mlp.up_proj.weight"])


def _hf_to_gguf_names(arch: str, hf_names: list[str]) -> dict[str, str]:
    """The GGUF name of each HF tensor, by inverting gguf_to_hf_name over every known part."""
    from pagedllm.model_loader import gguf as gguf_module

    parts = {**gguf_module._BLOCK_NAME_MAP, **gguf_module._ARCH_BLOCK_NAMES.get(arch, {})}
    inverse = {}
    for part in gguf_module._GLOBAL_NAME_MAP:
        for kind in ("weight", "bias"):
            inverse[gguf_to_hf_name(f"{part}.{kind}", arch)] = f"{part}.{kind}"
    for layer in range(8):
        for part in parts:
            for kind in ("weight", "bias"):
                gguf_name = f"blk.{layer}.{part}.{kind}"
                inverse[gguf_to_hf_name(gguf_name, arch)] = gguf_name
    return {name: inverse[name] for name in hf_names}


def _tiny_gguf_config(tmp_path: Path, arch: str, tensors: dict, **meta):
    """A ModelConfig of a tiny GGUF of `arch` holding `tensors`, written under tmp_path."""
    from tests.model_loader.test_safetensors import _model_config

    (tmp_path / "gguf").mkdir()
    path = _write_gguf(tmp_path / "gguf" / f"{arch}.gguf", arch, tensors, layers=2, hidden=64,
                       heads=4, vocab=200, context=256, **meta)  # fmt: skip
    return _model_config(tmp_path / "gguf", "float32", gguf_file=path.name)


def _assert_loads_parameters(model_config, expected: dict[str, torch.Tensor]) -> None:
    """The model loaded from `model_config` has exactly the `expected` parameters."""
    from pagedllm.model_loader import loader

    model = loader.get_model(model_config)
    for name, param in model.named_parameters():
        assert torch.equal(param, expected[name]), name


def test_phi3_gguf_loads_the_fused_tensors_as_the_checkpoint_has_them(tmp_path: Path) -> None:
    """A Phi-3 GGUF (fused attn_qkv and ffn_up, as llama.cpp writes them) gives our model
    exactly the parameters its Hugging Face checkpoint gives."""
    import transformers as tf

    from tests.models.test_model_parity import load_pair, save_random

    config = tf.Phi3Config(
        vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.2, tie_word_embeddings=False, pad_token_id=0,
    )  # fmt: skip
    hf_dir = save_random(tmp_path / "hf", config)
    ours, _, _ = load_pair(hf_dir)
    hf = {k: v.numpy() for k, v in load_file(hf_dir / "model.safetensors").items()}
    names = _hf_to_gguf_names("phi3", list(hf))
    tensors = {names[name]: (values, Q.F32) for name, values in hf.items()}
    model_config = _tiny_gguf_config(tmp_path, "phi3", tensors, ffn=96, kv_heads=2)
    assert model_config.architecture == "Phi3ForCausalLM"
    _assert_loads_parameters(model_config, dict(ours.named_parameters()))


def test_gguf_longrope_factors_are_refused(tmp_path: Path) -> None:
    values = np.ones((8,), np.float32)
    path = _write_gguf(tmp_path / "l.gguf", "phi3", {"rope_factors_long.weight": (values, Q.F32)})
    with pytest.raises(ValueError, match="LongRoPE factors"):
        list(iterate_gguf_weights(str(path)))


def _moe_gguf_tensors(arch: str, hf: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, Q]]:
    """HF tensors laid out as llama.cpp writes an MoE file (Qwen MoE, or Mixtral as
    "llama"): each projection's experts stacked into one 3D tensor, a shared expert's gate
    as a vector."""
    import re

    stacked: dict[str, list[tuple[int, np.ndarray]]] = {}
    others = {}
    for name, values in hf.items():
        match = re.match(r"(.+\.experts)\.(\d+)\.(\w+)\.weight$", name)
        if match:
            key = f"{match.group(1)}.{{expert}}.{match.group(3)}.weight"
            stacked.setdefault(key, []).append((int(match.group(2)), values))
        else:
            others[name] = values
    names = _hf_to_gguf_names(arch, list(others) + list(stacked))
    tensors = {}
    for name, values in others.items():
        if name.endswith("shared_expert_gate.weight"):
            values = values[0]
        tensors[names[name]] = (values, Q.F32)
    for name, parts in stacked.items():
        tensors[names[name]] = (np.stack([v for _, v in sorted(parts)]), Q.F32)
    return tensors


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_qwen_moe_gguf_splits_stacked_experts(tmp_path: Path, arch: str) -> None:
    """A Qwen MoE GGUF (experts stacked per projection, the shared expert, dense layers
    mixed in) gives our model exactly its safetensors checkpoint's parameters, with the
    expert sizes, dense layers and top-k renormalization its config needs."""
    from tests.models.test_model_parity import _config, load_pair, save_random

    hf_dir = save_random(tmp_path / "hf", _config(arch))
    ours, _, _ = load_pair(hf_dir)
    hf = {k: v.numpy() for k, v in load_file(hf_dir / "model.safetensors").items()}
    gguf_arch = arch.replace("_", "")
    meta = dict(ffn=96, kv_heads=2, experts=4, experts_used=2, expert_ffn=32)
    if arch == "qwen2_moe":
        meta["shared_ffn"] = 48
    else:
        meta["key_length"] = 16
    model_config = _tiny_gguf_config(tmp_path, gguf_arch, _moe_gguf_tensors(gguf_arch, hf),
                                     **meta)  # fmt: skip
    config = model_config.hf_config
    assert (config.moe_intermediate_size, config.norm_topk_prob) == (32, arch == "qwen3_moe")
    assert config.mlp_only_layers == ([1] if arch == "qwen2_moe" else [])
    _assert_loads_parameters(model_config, dict(ours.named_parameters()))


def test_stacked_expert_codes_split_per_expert(tmp_path: Path) -> None:
    """Quantized stacked experts split into per-expert codes equal to the dense split."""
    from pagedllm.layers.quantization import GroupCodes

    values = np.random.default_rng(4).standard_normal((3, 32, 64)).astype(np.float32)
    path = _write_gguf(tmp_path / "e.gguf", "qwen3moe",
                       {"blk.0.ffn_up_exps.weight": (values, Q.Q8_0)})  # fmt: skip
    dense = dict(iterate_gguf_weights(str(path)))
    codes = dict(iterate_gguf_weights(str(path), keep_codes=True))
    assert sorted(codes) == [f"model.layers.0.mlp.experts.{e}.up_proj.weight" for e in range(3)]
    for name, weight in codes.items():
        assert isinstance(weight, GroupCodes) and weight.shape == (32, 64)
        assert torch.equal(weight.dense(torch.float32), dense[name])
    third = dense["model.layers.0.mlp.experts.2.up_proj.weight"].numpy()
    assert np.abs(third - values[2]).max() < 0.05  # expert 2 is the third slice


def test_moe_gguf_with_float32_routers_runs_its_codes(tmp_path: Path) -> None:
    """llama.cpp keeps MoE routers float32 in a Q4_0 file: the file is still served with
    its 4-bit codes (it was dequantized whole to bf16, 4x slower decode), and its experts'
    3D matrices decide the method like any other matrix."""
    from pagedllm.model_loader.gguf import gguf_weight_quantization

    rng = np.random.default_rng(5)

    def values(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    tensors = {
        "blk.0.attn_q.weight": (values(64, 64), Q.Q4_0),
        "blk.0.ffn_gate_inp.weight": (values(4, 64), Q.F32),
        "blk.0.ffn_gate_inp_shexp.weight": (values(64), Q.F32),
        "blk.0.ffn_up_exps.weight": (values(4, 32, 64), Q.Q4_0),
    }
    path = _write_gguf(tmp_path / "m.gguf", "qwen2moe", tensors)
    assert gguf_weight_quantization(str(path)) == "int4"
    tensors["blk.0.ffn_up_exps.weight"] = (values(4, 32, 64), Q.F16)
    path = _write_gguf(tmp_path / "f.gguf", "qwen2moe", tensors)
    assert gguf_weight_quantization(str(path)) is None  # float experts: served dense


def test_mixtral_gguf_is_llama_with_experts(tmp_path: Path) -> None:
    """llama.cpp writes Mixtral as "llama" with stacked experts and permuted Q/K rows: it
    loads as MixtralForCausalLM with exactly its safetensors checkpoint's parameters."""
    from tests.models.test_model_parity import _config, load_pair, save_random

    hf_dir = save_random(tmp_path / "hf", _config("mixtral"))
    ours, _, _ = load_pair(hf_dir)
    hf = {k: v.numpy() for k, v in load_file(hf_dir / "model.safetensors").items()}
    for name in hf:
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            hf[name] = _llama_cpp_permute(hf[name], 4 if "q_proj" in name else 2)
    model_config = _tiny_gguf_config(tmp_path, "llama", _moe_gguf_tensors("llama", hf),
                                     ffn=96, kv_heads=2, experts=4, experts_used=2,
                                     expert_ffn=96)  # fmt: skip
    assert model_config.architecture == "MixtralForCausalLM"
    assert model_config.hf_config.num_local_experts == 4
    _assert_loads_parameters(model_config, dict(ours.named_parameters()))


def test_gpt2_gguf_loads_transposed_matrices_and_positions(tmp_path: Path) -> None:
    """A GPT-2 GGUF (Conv1D weights stored [out, in] as llama.cpp writes them, learned
    positions, LayerNorm biases) gives exactly its safetensors checkpoint's parameters."""
    from tests.models.test_model_parity import _config, load_pair, save_random

    hf_dir = save_random(tmp_path / "hf", _config("gpt2"))
    ours, _, _ = load_pair(hf_dir)
    expected = dict(ours.named_parameters())
    names = _hf_to_gguf_names("gpt2", list(expected))
    tensors = {names[name]: (p.detach().numpy(), Q.F32) for name, p in expected.items()}
    model_config = _tiny_gguf_config(tmp_path, "gpt2", tensors, ffn=256, kv_heads=4)
    assert model_config.architecture == "GPT2LMHeadModel"
    _assert_loads_parameters(model_config, expected)
