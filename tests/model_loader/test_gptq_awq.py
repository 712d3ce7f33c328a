"""GPTQ and AWQ 4-bit checkpoints: the tools' own packing and dequantization as references.

GPTQ layers are packed by AutoGPTQ's QuantLinear.pack and dequantized by its CPU forward;
AWQ layers are packed by AWQ's documented GEMM layout and dequantized by AutoAWQ's
`dequantize_gemm`. Both libraries are loaded file by file (their package imports need
CUDA-era dependencies this machine does not have): only their pure-torch code runs.
End to end, a tiny Llama quantized with AutoGPTQ's packing runs (1) in float32, dequantized,
token for token as transformers on the dequantized weights, and (2) in bfloat16 with the
4-bit codes kept (W4A8), each matrix within 1.5% of its dequantized float32 reference.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pagedllm.layers.quantization import W4A8Weight, W8A8Weight
from pagedllm.model_loader.gptq import W4A16Config, layer_codes

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _library_file(package: str, relative: str) -> ModuleType:
    """A module of a reference library, loaded from its file alone: from the folder the
    Makefile installs them in (`.venv/refs`), else from the environment."""
    folder = Path(sys.prefix) / "refs" / package
    if not folder.is_dir():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{package} is not installed (make installs it in .venv/refs)")
        folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / relative
    module_spec = importlib.util.spec_from_file_location(f"_ref_{package}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def autogptq() -> ModuleType:
    return _library_file("auto_gptq", "nn_modules/qlinear/qlinear_cuda.py")


@pytest.fixture(scope="module")
def autoawq() -> ModuleType:
    return _library_file("awq", "utils/packing_utils.py")


def _min_max_quantize(weight: torch.Tensor, group: int, sym: bool, bits: int = 4):
    """Per-group scales [out, groups] and zero points (as GPTQ's quantizer keeps them)."""
    out_size, in_size = weight.shape
    top = (1 << bits) - 1
    groups = weight.view(out_size, in_size // group, group)
    if sym:
        amax = groups.abs().amax(-1)
        scales = (2 * amax / top).clamp(min=1e-5)
        zeros = torch.full_like(scales, float((top + 1) // 2))
    else:
        high, low = groups.amax(-1), groups.amin(-1)
        scales = ((high - low) / top).clamp(min=1e-5)
        zeros = torch.round(-low / scales).clamp(0, top)
    return scales.half().float(), zeros


def _on_grid(weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int,
             bits: int = 4):
    """scale * (clamp(round(w / scale) + zero, 0, 2^bits - 1) - zero), per group (GPTQ)."""
    s, z = scales.repeat_interleave(group, 1), zeros.repeat_interleave(group, 1)
    return (torch.clamp(torch.round(weight / s) + z, 0, (1 << bits) - 1) - z) * s


def gptq_pack(autogptq: ModuleType, weight: torch.Tensor, group: int, sym: bool,
              perm: torch.Tensor | None = None, bits: int = 4):
    """AutoGPTQ's packing of `weight` [out, in]; returns (tensors, library's dequantized).
    With `perm` (act-order), group g holds inputs perm[g * group: (g + 1) * group]."""
    out_size, in_size = weight.shape
    perm = torch.arange(in_size) if perm is None else perm
    ordered = weight[:, perm]
    scales, zeros = _min_max_quantize(ordered, group, sym, bits)
    grid = torch.empty_like(weight)
    # GPTQ hands pack() the weight already rounded to its grid (pack itself does not clamp).
    grid[:, perm] = _on_grid(ordered, scales, zeros, group, bits)
    g_idx = torch.empty(in_size, dtype=torch.int32)
    g_idx[perm] = (torch.arange(in_size) // group).to(torch.int32)
    linear = torch.nn.Linear(in_size, out_size, bias=False)
    linear.weight.data = grid
    layer = autogptq.QuantLinear(bits, group, in_size, out_size, False)
    layer.pack(linear, scales, zeros, g_idx)
    tensors = {"qweight": layer.qweight, "qzeros": layer.qzeros,
               "scales": layer.scales.half(), "g_idx": layer.g_idx}
    layer.scales = layer.scales.float()  # its CPU forward dequantizes: read it in float32
    dequantized = layer(torch.eye(in_size)).T  # [out, in]
    torch.testing.assert_close(dequantized, grid, rtol=0, atol=1e-6)  # what was quantized
    return tensors, dequantized


def awq_pack(weight: torch.Tensor, group: int):
    """AWQ's GEMM packing (documented layout): qweight [in, out/8], qzeros [groups, out/8]."""
    out_size, in_size = weight.shape
    scales, zeros = _min_max_quantize(weight, group, sym=False)
    q = torch.clamp(torch.round(weight / scales.repeat_interleave(group, 1))
                    + zeros.repeat_interleave(group, 1), 0, 15).to(torch.int32)

    def pack(values: torch.Tensor) -> torch.Tensor:  # [r, c] → [r, c / 8], AWQ's order
        words = values.view(values.shape[0], -1, 8)
        packed = torch.zeros(words.shape[:2], dtype=torch.int32)
        for i, column in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):
            packed |= words[:, :, column] << (4 * i)
        return packed

    return {"qweight": pack(q.T.contiguous()), "qzeros": pack(zeros.T.to(torch.int32)),
            "scales": scales.T.contiguous().half()}


@pytest.mark.parametrize("group, sym", [(32, True), (64, False), (-1, False)])
def test_gptq_codes_equal_autogptq_dequantization(autogptq, group, sym):
    weight = torch.randn(96, 128)
    size = 128 if group == -1 else group
    tensors, reference = gptq_pack(autogptq, weight, size, sym)
    config = W4A16Config.parse({"quant_method": "gptq", "bits": 4, "group_size": group,
                                "desc_act": False, "sym": sym})
    codes = layer_codes(config, tensors, "layer")
    assert torch.equal(codes.dense(torch.float32), reference)


@pytest.mark.parametrize("group", [32, -1])
def test_gptq_8bit_codes_equal_autogptq_dequantization(autogptq, group):
    weight = torch.randn(64, 128)
    tensors, reference = gptq_pack(autogptq, weight, 128 if group == -1 else group, True,
                                   bits=8)
    config = W4A16Config.parse({"quant_method": "gptq", "bits": 8, "group_size": group,
                                "sym": True})
    codes = layer_codes(config, tensors, "layer")
    assert not codes.is_int4 and config.kernel_method == "int8"
    assert torch.equal(codes.dense(torch.float32), reference)


@pytest.mark.parametrize("group", [32, 64])
def test_awq_codes_equal_autoawq_dequantization(autoawq, group):
    weight = torch.randn(64, 128)
    tensors = awq_pack(weight, group)
    reference = autoawq.dequantize_gemm(tensors["qweight"], tensors["qzeros"],
                                        tensors["scales"].float(), 4, group).T
    config = W4A16Config.parse({"quant_method": "awq", "bits": 4, "group_size": group,
                                "zero_point": True, "version": "GEMM"})
    codes = layer_codes(config, tensors, "layer")
    assert torch.equal(codes.dense(torch.float32), reference)


@pytest.mark.parametrize("config, words", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits=3"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": False}, "asymmetric 8-bit"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, "only 4-bit awq"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 48}, "group_size=48"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "gemv"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "marlin"),
    ({"quant_method": "bitsandbytes"}, "bitsandbytes"),
])
def test_unsupported_schemes_are_named(config, words):
    with pytest.raises(ValueError, match=words):
        W4A16Config.parse(config)


def test_act_order_codes_equal_autogptq_dequantization(autogptq):
    """desc_act: groups gather inputs from anywhere; the codes are lined up by group and
    the layer reads its input in that order."""
    weight = torch.randn(64, 128)  # AutoGPTQ packs zeros 32 outputs at a time
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(0))
    tensors, reference = gptq_pack(autogptq, weight, 32, True, perm)
    config = W4A16Config.parse({"quant_method": "gptq", "bits": 4, "group_size": 32,
                                "desc_act": True})
    codes = layer_codes(config, tensors, "layer")
    assert codes.input_perm is not None
    assert torch.equal(codes.dense(torch.float32), reference)
    bad = dict(tensors, g_idx=torch.zeros(128, dtype=torch.int32))  # one group of 128
    with pytest.raises(ValueError, match="g_idx"):
        layer_codes(config, bad, "layer")


def _write_checkpoints(tiny_llama_dir: Path, folder: Path, quantize, quantization_config):
    """The tiny Llama with every decoder matrix packed by `quantize(name, weight)` → (tensors,
    dequantized), and the same model with those matrices dequantized (the reference)."""
    from safetensors.torch import load_file, save_file

    quantized, dense = folder / "quantized", folder / "dequantized"
    quantized.mkdir()
    dense.mkdir()
    weights = load_file(str(tiny_llama_dir / "model.safetensors"))
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        module = name.rsplit(".", 2)
        if name.endswith(".weight") and module[-2] in TARGETS:
            prefix = name[: -len(".weight")]
            tensors, dequantized = quantize(prefix, tensor)
            packed.update({f"{prefix}.{part}": value for part, value in tensors.items()})
            weights[name] = dequantized.contiguous()
        else:
            packed[name] = tensor
    save_file(packed, str(quantized / "model.safetensors"))
    save_file(weights, str(dense / "model.safetensors"))
    for source in tiny_llama_dir.iterdir():
        if source.name == "model.safetensors":
            continue
        for target in (quantized, dense):
            (target / source.name).write_bytes(source.read_bytes())
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (quantized / "config.json").write_text(json.dumps(config))
    return quantized, dense


@pytest.fixture(scope="module")
def gptq_checkpoint(autogptq, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every decoder matrix GPTQ-packed by AutoGPTQ (symmetric, groups of 32)."""
    return _write_checkpoints(
        tiny_llama_dir, tmp_path_factory.mktemp("gptq"),
        lambda name, weight: gptq_pack(autogptq, weight, 32, sym=True),
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True,
         "checkpoint_format": "gptq"},
    )


@pytest.fixture(scope="module")
def awq_checkpoint(autoawq, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every decoder matrix AWQ-packed (GEMM, groups of 64), dequantized by AutoAWQ."""

    def quantize(name: str, weight: torch.Tensor):
        tensors = awq_pack(weight, 64)
        dequantized = autoawq.dequantize_gemm(tensors["qweight"], tensors["qzeros"],
                                              tensors["scales"].float(), 4, 64).T
        return tensors, dequantized

    return _write_checkpoints(
        tiny_llama_dir, tmp_path_factory.mktemp("awq"), quantize,
        {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
         "version": "gemm"},
    )


@pytest.fixture(scope="module")
def act_order_checkpoint(autogptq, tiny_llama_dir: Path,
                         tmp_path_factory: pytest.TempPathFactory):
    """GPTQ with desc_act: each matrix's groups gather inputs in a random order, one order
    per input (q, k and v share the layer's, as gate and up do: GPTQ orders a layer's
    inputs by their activations, which the fused matrices share)."""
    orders: dict[tuple[str, int], torch.Tensor] = {}

    def quantize(name: str, weight: torch.Tensor):
        shared = name.rsplit(".", 1)[-1]
        shared = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(
            shared, shared)
        key = (name.rsplit(".", 1)[0] + shared, weight.shape[1])
        if key not in orders:
            orders[key] = torch.randperm(weight.shape[1],
                                         generator=torch.Generator().manual_seed(len(orders)))
        return gptq_pack(autogptq, weight, 32, sym=False, perm=orders[key])

    return _write_checkpoints(
        tiny_llama_dir, tmp_path_factory.mktemp("gptq_act_order"), quantize,
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False},
    )


@pytest.fixture(scope="module")
def gptq8_checkpoint(autogptq, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every decoder matrix 8-bit GPTQ-packed by AutoGPTQ (symmetric, groups of 32)."""
    return _write_checkpoints(
        tiny_llama_dir, tmp_path_factory.mktemp("gptq8"),
        lambda name, weight: gptq_pack(autogptq, weight, 32, sym=True, bits=8),
        {"quant_method": "gptq", "bits": 8, "group_size": 32, "desc_act": False, "sym": True},
    )


def test_gptq_8bit_float32_equals_transformers(gptq8_checkpoint):
    _check_float32_greedy(*gptq8_checkpoint)


def test_gptq_8bit_bfloat16_runs_int8_codes(gptq8_checkpoint):
    _check_bfloat16_matrices(*gptq8_checkpoint, act_order=False, kind=W8A8Weight)


def test_act_order_float32_equals_transformers(act_order_checkpoint):
    _check_float32_greedy(*act_order_checkpoint)


def test_act_order_bfloat16_reads_inputs_in_group_order(act_order_checkpoint):
    _check_bfloat16_matrices(*act_order_checkpoint, act_order=True)


def test_awq_float32_equals_transformers_on_the_dequantized_weights(awq_checkpoint):
    _check_float32_greedy(*awq_checkpoint)


def _check_float32_greedy(quantized: Path, dense: Path, **engine_args) -> None:
    from transformers import AutoModelForCausalLM

    from pagedllm import LLM, SamplingParams
    from tests.conftest import hf_greedy_tokens

    prompts = [[5, 9, 30, 2, 77], [100, 3, 3, 41, 8, 19, 60]]
    reference = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
    want = hf_greedy_tokens(reference, prompts, 12)
    llm = LLM(str(quantized), dtype="float32", max_model_len=128, **engine_args)
    assert llm.llm_engine.engine_config.model_config.quantization is None  # dequantized
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == want


def test_quantization_argument_must_match_the_checkpoint(gptq_checkpoint, tiny_llama_dir):
    from pagedllm.engine.arg_utils import EngineArgs

    quantized, _ = gptq_checkpoint
    with pytest.raises(ValueError, match="quantized with gptq"):
        EngineArgs(model=str(quantized), quantization="awq").create_engine_config()
    with pytest.raises(ValueError, match="no quantization_config"):
        EngineArgs(model=str(tiny_llama_dir), quantization="gptq").create_engine_config()
    config = EngineArgs(model=str(quantized), quantization="gptq",
                        dtype="bfloat16").create_engine_config().model_config
    assert config.checkpoint_quantization["quant_method"] == "gptq"
    # "auto" runs a quantized checkpoint in bfloat16 where its 4-bit kernels are fast.
    from pagedllm.platform import get_platform

    auto = EngineArgs(model=str(quantized)).create_engine_config().model_config
    assert auto.dtype == ("bfloat16" if get_platform("cpu").bf16_is_fast("int4") else "float32")
    assert auto.quantization == ("int4" if auto.dtype == "bfloat16" else None)


def test_unsupported_checkpoint_scheme_fails_at_load(tiny_llama_dir, tmp_path):
    from pagedllm.engine.arg_utils import EngineArgs

    for source in tiny_llama_dir.iterdir():
        (tmp_path / source.name).write_bytes(source.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'bitsandbytes' is not built"):
        EngineArgs(model=str(tmp_path)).create_engine_config()


def test_gptq_float32_equals_transformers_on_the_dequantized_weights(gptq_checkpoint):
    _check_float32_greedy(*gptq_checkpoint)
    # quantization="none" dequantizes too.
    _check_float32_greedy(*gptq_checkpoint, quantization="none")


def test_gptq_bfloat16_keeps_the_codes_each_matrix_near_float32(gptq_checkpoint):
    _check_bfloat16_matrices(*gptq_checkpoint, act_order=False)


def _check_bfloat16_matrices(quantized: Path, dense: Path, act_order: bool,
                             kind: type = W4A8Weight) -> None:
    """bfloat16: every matrix runs W4A8 on the checkpoint's codes, within 1.5% of its
    dequantized float32 reference (the W4A8 kernel quantizes activations to int8 per 16
    values: about 0.5%); act-order layers read their input in group order."""
    from safetensors.torch import load_file

    from pagedllm import LLM, SamplingParams

    llm = LLM(str(quantized), dtype="bfloat16", max_model_len=256)
    config = llm.llm_engine.engine_config.model_config
    method = "int4" if kind is W4A8Weight else "int8"
    if config.dtype != "bfloat16" or config.quantization != method:
        pytest.skip(f"4-bit kernels not in use here ({config.dtype}, {config.quantization})")
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    layer = model.model.layers[0]
    dense_weights = load_file(str(dense / "model.safetensors"))
    prefix = "model.layers.0."
    references = {
        "qkv": torch.cat([dense_weights[f"{prefix}self_attn.{n}_proj.weight"] for n in "qkv"]),
        "o": dense_weights[f"{prefix}self_attn.o_proj.weight"],
        "gate_up": torch.cat([dense_weights[f"{prefix}mlp.{n}_proj.weight"]
                              for n in ("gate", "up")]),
        "down": dense_weights[f"{prefix}mlp.down_proj.weight"],
    }
    linears = {"qkv": layer.self_attn.qkv_proj, "o": layer.self_attn.o_proj,
               "gate_up": layer.mlp.gate_up_proj, "down": layer.mlp.down_proj}
    generator = torch.Generator().manual_seed(1)
    for name, linear in linears.items():
        assert isinstance(linear.quantized, kind)
        assert (linear.input_perm is not None) == act_order
        x = torch.randn(4, linear.input_size, generator=generator).to(torch.bfloat16)
        got = linear(x).float()  # 4 tokens: the W4A8 path
        want = x.float() @ references[name].T
        error = ((got - want).norm() / want.norm()).item()
        assert error < 0.015, (name, error)
    if act_order:  # the one-call decode stack does not permute inputs: it steps aside
        runner = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner
        assert runner.decode_step is None
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}],
                       SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def _greedy_on_triton_codes(quantized, dense, expected_bits: int, monkeypatch) -> None:
    """float32 greedy tokens of the checkpoint run on its codes by the GPU's Triton group
    kernel (in Triton's interpreter here) equal transformers' on the dequantized weights."""
    from transformers import AutoModelForCausalLM

    from pagedllm import LLM, SamplingParams
    from pagedllm.layers.quantization import TritonGroupWeight
    from tests.conftest import hf_greedy_tokens

    monkeypatch.setenv("PAGEDLLM_QUANTIZED_MATMUL", "triton")

    prompts = [[5, 9, 30, 2, 77], [100, 3, 3, 41, 8, 19, 60]]
    reference = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
    want = hf_greedy_tokens(reference, prompts, 12)
    llm = LLM(str(quantized), dtype="float32", max_model_len=128)
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    for linear in (model.model.layers[0].self_attn.qkv_proj, model.model.layers[1].mlp.down_proj):
        assert isinstance(linear.quantized, TritonGroupWeight)
        assert linear.quantized.bits == expected_bits and not linear.keeps_dense
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == want


@pytest.mark.usefixtures("triton_interpreter")
def test_gptq_on_triton_runs_its_codes_token_exact(gptq_checkpoint, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")  # the whole GPU path
    _greedy_on_triton_codes(*gptq_checkpoint, 4, monkeypatch)


@pytest.mark.usefixtures("triton_interpreter")
def test_act_order_on_triton_runs_its_codes_token_exact(act_order_checkpoint, monkeypatch):
    _greedy_on_triton_codes(*act_order_checkpoint, 4, monkeypatch)


@pytest.mark.usefixtures("triton_interpreter")
def test_gptq_8bit_on_triton_runs_its_codes_token_exact(gptq8_checkpoint, monkeypatch):
    _greedy_on_triton_codes(*gptq8_checkpoint, 8, monkeypatch)


@pytest.mark.usefixtures("triton_interpreter")
def test_awq_on_triton_runs_its_codes_token_exact(awq_checkpoint, monkeypatch) -> None:
    _greedy_on_triton_codes(*awq_checkpoint, 4, monkeypatch)
