"""The platform objects: one per device kind, and the choices each makes from its facts."""

from __future__ import annotations

import gc
import types

import pytest
import torch

from pagedllm.platform import cpu_platform, current_platform, get_platform
from pagedllm.platform.cpu import CpuPlatform
from pagedllm.platform.cuda import CudaPlatform


def _plan(native_bf16: bool, byte_dot_kernels: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(native_bf16=native_bf16, byte_dot_kernels=byte_dot_kernels,
                                 reason="a test CPU")


def test_one_platform_per_device_kind():
    assert get_platform("cpu") is get_platform(torch.device("cpu")) is cpu_platform()
    assert isinstance(get_platform("cuda:1"), CudaPlatform)
    assert get_platform("cuda") is get_platform(torch.device("cuda", 0))
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert current_platform().device_type == expected
    with pytest.raises(ValueError, match="device must be"):
        get_platform("tpu")


def test_cpu_without_kernels_takes_torch_paths():
    platform = cpu_platform()
    with platform.use_kernels(None):
        assert platform.attention_backend(torch.bfloat16) == "torch_grouped"
        assert not platform.byte_dot_kernels(torch.bfloat16)
        assert not platform.fused_ops()
        assert not platform.keeps_file_codes("int4", torch.bfloat16)
        assert not platform.lora_kernel(torch.bfloat16)


def test_cpu_with_kernels_takes_them_for_the_dtypes_they_serve():
    platform = cpu_platform()
    if platform.kernel_library() is None:
        pytest.skip("no C compiler here")
    simd = platform.kernel_library().variant.simd
    assert platform.attention_backend(torch.float32) == "cpu"
    assert platform.attention_backend(torch.bfloat16) == "cpu"
    assert platform.attention_backend(torch.float16) == "torch_grouped"
    assert platform.byte_dot_kernels(torch.bfloat16) is simd
    assert not platform.byte_dot_kernels(torch.float32)
    assert platform.keeps_file_codes("int4", torch.bfloat16) is simd
    assert not platform.keeps_file_codes(None, torch.bfloat16)


def test_environment_steers_the_choices_when_asked(monkeypatch):
    platform = cpu_platform()
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "torch")
    assert platform.attention_backend(torch.float32) == "torch"
    monkeypatch.delenv("PAGEDLLM_ATTENTION_BACKEND")
    monkeypatch.setenv("PAGEDLLM_ATTENTION_KERNEL", "torch")
    assert platform.attention_backend(torch.float32) == "torch_grouped"
    monkeypatch.setenv("PAGEDLLM_DECODE_STACK", "python")
    assert platform.decode_step_kind() is None
    monkeypatch.setenv("PAGEDLLM_EMULATE_CUDA_GRAPHS", "1")
    assert platform.decode_step_kind() == "cuda_graphs"


@pytest.mark.parametrize(
    ("native", "byte_dot", "quantization", "fast"),
    [(True, False, None, True), (False, True, "int4", True), (False, True, "fp8", True),
     (False, True, None, False), (False, False, "int4", False)],
)
def test_bf16_speed_follows_the_cpu(monkeypatch, native, byte_dot, quantization, fast):
    monkeypatch.setattr(CpuPlatform, "plan", _plan(native, byte_dot))
    assert CpuPlatform().bf16_is_fast(quantization) is fast


def test_cpu_defaults(monkeypatch):
    platform = CpuPlatform()
    assert platform.default_preemption_mode == "recompute"
    assert platform.runs_checkpoint_codes("bfloat16") and platform.runs_gguf_codes()
    monkeypatch.setattr(CpuPlatform, "plan", _plan(True))
    assert platform.ngram_batch_limit("bfloat16") == 32
    assert platform.ngram_batch_limit("float32") is None
    monkeypatch.setattr(CpuPlatform, "plan", _plan(False))
    assert platform.ngram_batch_limit("bfloat16") is None


def test_cuda_choices(monkeypatch):
    platform = CudaPlatform()
    assert platform.default_preemption_mode == "swap"
    assert platform.pin_memory and platform.dist_backend == "nccl"
    assert platform.decode_step_kind() == "cuda_graphs" and platform.captures_graphs()
    monkeypatch.setattr(CudaPlatform, "runs_triton", lambda self: True)
    assert platform.attention_backend(torch.bfloat16) == "triton"
    assert platform.group_weights_on_triton() and platform.runs_gguf_codes()
    monkeypatch.setenv("PAGEDLLM_QUANTIZED_MATMUL", "native")
    assert not platform.group_weights_on_triton()
    monkeypatch.delenv("PAGEDLLM_QUANTIZED_MATMUL")
    monkeypatch.setattr(CudaPlatform, "runs_triton", lambda self: False)
    assert platform.attention_backend(torch.bfloat16) == "torch_grouped"
    assert not platform.runs_gguf_codes()


def test_cuda_kv_budget_frees_dropped_engines_first(monkeypatch):
    """An engine dropped earlier in the process but kept alive by a reference cycle (its KV
    cache, its graph pools) must not count as memory used by others: on an H100 the second
    LLM of a test got a budget of 0 blocks until the budget collected garbage first."""
    total = 80 * 2**30
    held = {"bytes": 0}

    class DroppedEngine:
        def __init__(self) -> None:
            self.cycle = self
            held["bytes"] += 70 * 2**30

        def __del__(self) -> None:
            held["bytes"] -= 70 * 2**30

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (total - held["bytes"], total))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    gc.disable()  # no automatic collection between the drop and the budget
    try:
        DroppedEngine()
        assert held["bytes"] > 0  # still alive: only the cycle collector frees it
        assert CudaPlatform().kv_cache_budget_bytes(0.9) == int(total * 0.9)
    finally:
        gc.enable()
