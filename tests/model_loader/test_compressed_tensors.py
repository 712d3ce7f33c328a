"""compressed-tensors checkpoints made by the compressed-tensors library itself (the format
llm-compressor writes): W4A16 pack-quantized (symmetric, asymmetric, per channel), W8A8
int8, FP8 per channel and per tensor. Each layer equals the library's own dequantization;
float32 runs token for token as transformers on the dequantized weights; bfloat16 keeps
the int codes on the byte kernels within 1.5% per matrix, and FP8 (dequantized) is
measured against the format's definition (FP8 activations included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("compressed_tensors")

from pagedllm.layers.quantization import W4A8Weight, W8A8Weight  # noqa: E402
from pagedllm.model_loader.compressed_tensors import (  # noqa: E402
    CompressedTensorsConfig,
    _layer_weight,
)

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _scheme(kind: str):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    def args(**kw):
        return QuantizationArgs(**kw)

    weights, activations, fmt = {
        "w4a16": (args(num_bits=4, type="int", symmetric=True, strategy="group",
                       group_size=32), None, "pack-quantized"),
        "w4a16_asym": (args(num_bits=4, type="int", symmetric=False, strategy="group",
                            group_size=64), None, "pack-quantized"),
        "w4a16_channel": (args(num_bits=4, type="int", symmetric=True, strategy="channel"),
                          None, "pack-quantized"),
        "w8a8": (args(num_bits=8, type="int", symmetric=True, strategy="channel"),
                 args(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True),
                 "int-quantized"),
        "fp8_channel": (args(num_bits=8, type="float", symmetric=True, strategy="channel"),
                        args(num_bits=8, type="float", symmetric=True, strategy="token",
                             dynamic=True), "float-quantized"),
        "fp8_tensor": (args(num_bits=8, type="float", symmetric=True, strategy="tensor"),
                       args(num_bits=8, type="float", symmetric=True, strategy="token",
                            dynamic=True), "float-quantized"),
    }[kind]
    return QuantizationScheme(targets=["Linear"], weights=weights,
                              input_activations=activations), fmt


def make_checkpoint(source: Path, out: Path, kind: str) -> Path:
    """The tiny model compressed by compressed-tensors (min-max scales, as a one-shot
    weight-only pass of llm-compressor would give)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    scheme, fmt = _scheme(kind)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        weight, args = module.weight.data, module.quantization_scheme.weights
        if args.strategy == "channel":
            low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
        elif args.strategy == "group":
            grouped = weight.view(weight.shape[0], -1, args.group_size)
            low, high = grouped.amin(-1), grouped.amax(-1)
        else:
            low, high = weight.amin().view(1), weight.amax().view(1)
        scale, zero = calculate_qparams(low, high, args)
        module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(
            module.weight_scale.shape)
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data = zero.to(module.weight_zero_point.dtype).reshape(
                module.weight_zero_point.shape)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            (out / name).write_bytes((source / name).read_bytes())
    return out


def library_dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """Every quantized layer's weight as compressed-tensors' own `dequantize` gives it."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    args = QuantizationArgs(**next(iter(config["config_groups"].values()))["weights"])
    stored = load_file(str(folder / "model.safetensors"))
    dense = {}
    for name in stored:
        if not name.endswith(".weight_scale"):
            continue
        prefix = name[: -len(".weight_scale")]
        scale = stored[name]
        if f"{prefix}.weight_packed" in stored:
            shape = torch.Size(stored[f"{prefix}.weight_shape"].tolist())
            q = unpack_from_int32(stored[f"{prefix}.weight_packed"], 4, shape)
            zero = stored.get(f"{prefix}.weight_zero_point")
            if zero is not None:
                zero = unpack_from_int32(zero, 4, scale.shape, packed_dim=0)
            dense[prefix] = dequantize(q, scale, zero, args, dtype=torch.float32)
        else:
            dense[prefix] = dequantize(stored[f"{prefix}.weight"], scale, None, args,
                                       dtype=torch.float32)
    return dense


KINDS = ["w4a16", "w4a16_asym", "w4a16_channel", "w8a8", "fp8_channel", "fp8_tensor"]


@pytest.fixture(scope="module", params=KINDS)
def checkpoint(request, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """(kind, compressed folder, the same model with the library's dequantized weights)."""
    from safetensors.torch import load_file, save_file

    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    compressed = make_checkpoint(tiny_llama_dir, folder / "compressed", kind)
    dense_dir = folder / "dense"
    dense_dir.mkdir()
    weights = load_file(str(tiny_llama_dir / "model.safetensors"))
    for prefix, weight in library_dequantized(compressed).items():
        weights[f"{prefix}.weight"] = weight.contiguous()
    save_file(weights, str(dense_dir / "model.safetensors"))
    for source in tiny_llama_dir.iterdir():
        if source.name != "model.safetensors":
            (dense_dir / source.name).write_bytes(source.read_bytes())
    return kind, compressed, dense_dir


def test_each_layer_equals_the_library_dequantization(checkpoint):
    from safetensors.torch import load_file

    _, compressed, _ = checkpoint
    config = CompressedTensorsConfig.parse(
        json.loads((compressed / "config.json").read_text())["quantization_config"])
    stored = load_file(str(compressed / "model.safetensors"))
    for prefix, want in library_dequantized(compressed).items():
        parts = {k[len(prefix) + 1:]: v for k, v in stored.items() if k.startswith(prefix + ".")}
        got = _layer_weight(config, parts, prefix)
        got = got if isinstance(got, torch.Tensor) else got.dense(torch.float32)
        # d * q + m against (q - zero) * scale: equal up to float32 rounding.
        torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=1e-6, msg=prefix)


def test_float32_equals_transformers_on_the_dequantized_weights(checkpoint):
    from transformers import AutoModelForCausalLM

    from pagedllm import LLM, SamplingParams
    from tests.conftest import hf_greedy_tokens

    _, compressed, dense = checkpoint
    prompts = [[5, 9, 30, 2, 77], [100, 3, 3, 41, 8, 19, 60]]
    reference = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
    want = hf_greedy_tokens(reference, prompts, 12)
    llm = LLM(str(compressed), dtype="float32", max_model_len=128)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == want


def _fp8_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the FP8 scheme's dynamic per-token activation quantization leaves it."""
    scale = x.abs().amax(-1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def test_bfloat16_runs_the_codes_near_the_definition(checkpoint):
    """int codes run on the byte kernels (W4A8 / W8A8) within 1.5% of the dequantized
    float32 matrix; FP8 runs dequantized in bf16, measured against the format's definition
    (FP8 per-token activations): 2.5%."""
    from safetensors.torch import load_file

    from pagedllm import LLM

    kind, compressed, dense = checkpoint
    llm = LLM(str(compressed), dtype="bfloat16", max_model_len=256)
    config = llm.llm_engine.engine_config.model_config
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    layer = model.model.layers[0]
    expected_kind = {"int4": W4A8Weight, "int8": W8A8Weight}.get(str(config.quantization))
    if kind.startswith("fp8"):
        assert config.quantization is None  # dequantized: int8 groups cannot hold FP8
    elif expected_kind is None:
        pytest.skip(f"byte kernels not in use here ({config.dtype}, {config.quantization})")
    weights = load_file(str(dense / "model.safetensors"))
    prefix = "model.layers.0."
    references = {
        "qkv": torch.cat([weights[f"{prefix}self_attn.{n}_proj.weight"] for n in "qkv"]),
        "down": weights[f"{prefix}mlp.down_proj.weight"],
    }
    linears = {"qkv": layer.self_attn.qkv_proj, "down": layer.mlp.down_proj}
    generator = torch.Generator().manual_seed(3)
    for name, linear in linears.items():
        x = torch.randn(4, linear.input_size, generator=generator).to(torch.bfloat16)
        got = linear(x).float()
        if kind.startswith("fp8"):  # dequantized bf16 weights; activations not FP8
            want = _fp8_activations(x.float()) @ references[name].T
            bound = 0.05  # the definition's FP8 activations: 3 mantissa bits, ~2.5%
        else:
            assert isinstance(linear.quantized, expected_kind)
            want = x.float() @ references[name].T
            bound = 0.015
        error = ((got - want).norm() / want.norm()).item()
        assert error < bound, (kind, name, error)


@pytest.mark.parametrize("change, words", [
    ({"format": "marlin-24"}, "'marlin-24' is not built"),
    ({"weights": {"num_bits": 2, "type": "int", "strategy": "group", "group_size": 32}},
     "2-bit int"),
    ({"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16}},
     "group_size=16"),
    ({"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                  "actorder": "group"}}, "actorder"),
    ({"weights": {"num_bits": 8, "type": "int", "strategy": "tensor"}, "format":
      "int-quantized"}, "strategy 'tensor'"),
    ({"input_activations": {"num_bits": 8, "type": "int", "dynamic": False},
      "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
      "format": "int-quantized"}, "static input scales"),
])
def test_unsupported_schemes_are_named(change, words):
    group = {"format": "pack-quantized", "targets": ["Linear"],
             "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}
    group.update(change)
    config = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
    with pytest.raises(ValueError, match=words):
        CompressedTensorsConfig.parse(config)
    with pytest.raises(ValueError, match="sparsity_config"):
        CompressedTensorsConfig.parse({**config, "sparsity_config": {"format": "sparse-24"}})
