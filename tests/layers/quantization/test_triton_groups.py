"""Group-quantized weights on the Triton kernel (W4A16 / W8A16), run by Triton's interpreter
on CPU: every code format the loader hands over (int4 with minimums as Q4_0/Q4_1/Q4_K,
Q5_K's 5-bit codes, Q8_0, Q6_K's half-group scales) is kept exactly and the kernel
multiplies as the dense weight would. GPTQ / AWQ checkpoints through the engine on these
weights: tests/model_loader/test_gptq_awq.py; the real GGUFs: test_gguf_triton.py."""

from __future__ import annotations

import pytest
import torch

from pagedllm.layers.quantization import (
    GroupCodes,
    TritonGroupWeight,
    quantize_for_triton,
    triton_weight_from_codes,
    uses_triton_weights,
)

pytestmark = pytest.mark.usefixtures("triton_interpreter")
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def triton_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDLLM_QUANTIZED_MATMUL", "triton")


def _codes(kind: str, rows: int, groups: int, seed: int = 0) -> GroupCodes:
    """Random file codes of one format, as the GGUF / checkpoint loaders build them."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.rand(rows, groups, generator=gen) * 0.1 + 0.01
    mins = -torch.rand(rows, groups, generator=gen) * 0.5
    if kind == "int4":  # Q4_1 / Q4_K sub-blocks (Q4_0: mins = -8 d)
        return GroupCodes(torch.randint(0, 16, (rows, groups, 32), generator=gen,
                                        dtype=torch.uint8), scales, mins)
    if kind == "int5":  # Q5_K
        return GroupCodes(torch.randint(0, 32, (rows, groups, 32), generator=gen,
                                        dtype=torch.uint8), scales, mins)
    signed = torch.randint(-127, 128, (rows, groups, 32), generator=gen, dtype=torch.int8)
    if kind == "int8":  # Q8_0
        return GroupCodes(signed, scales, None)
    halves = torch.rand(rows, groups, 2, generator=gen) * 0.1  # Q6_K
    return GroupCodes(signed.clamp(-32, 31), halves, None)


KINDS = ["int4", "int5", "int8", "int8_half_scales"]


@pytest.mark.parametrize("kind", KINDS)
def test_file_codes_are_kept_exactly(kind: str) -> None:
    codes = _codes(kind, 40, 3)
    weight = triton_weight_from_codes(codes, CPU)
    assert weight.bits == (4 if kind == "int4" else 8)
    assert torch.equal(weight.dense(torch.float32), codes.dense(torch.float32))
    assert weight.nbytes() < codes.codes.numel() * (0.8 if kind == "int4" else 1.6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 17, 70])
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_multiplies_as_the_dense_weight(kind: str, num_tokens: int,
                                               dtype: torch.dtype) -> None:
    """N = 80 (a partial column tile), K = 256 (8 groups, split over programs by default)."""
    codes = _codes(kind, 80, 8, seed=1)
    weight = triton_weight_from_codes(codes, CPU)
    x = torch.randn(num_tokens, 256, generator=torch.Generator().manual_seed(2)).to(dtype)
    got = weight.matmul(x)
    assert got.dtype == dtype and got.shape == (num_tokens, 80)
    want = x.float() @ codes.dense(dtype).float().T  # the dense weight in x's dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    else:  # only the output's rounding to bfloat16 differs: half a unit in the last place
        assert ((got.float() - want).abs() <= want.abs() * 2**-8 + 1e-3).all()


def test_split_k_sums_the_same_products() -> None:
    from pagedllm.triton_kernels.group_matmul import group_matmul, split_k_for

    codes = _codes("int4", 64, 16, seed=3)
    weight = triton_weight_from_codes(codes, CPU)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(4))
    whole = group_matmul(x, weight.codes, weight.scales, weight.mins, 4, split_k=1)
    for split in (2, 4):
        parts = group_matmul(x, weight.codes, weight.scales, weight.mins, 4, split_k=split)
        torch.testing.assert_close(parts, whole, atol=1e-4, rtol=1e-5)
    # The default split follows the weight's shape only, and divides its groups.
    assert split_k_for(64, 16) == 4 and split_k_for(64 * 256, 16) == 1
    assert 16 % split_k_for(576, 16) == 0


@pytest.mark.parametrize(("method", "bound"), [("int4", 0.5 / 15), ("int8", 0.5 / 127),
                                               ("fp8", 0.07)])
def test_dense_weights_quantize_within_their_format(method: str, bound: float) -> None:
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(5))
    quantized = quantize_for_triton(weight, method)
    assert isinstance(quantized, TritonGroupWeight)
    error = (quantized.dense(torch.float32) - weight).abs().view(48, 4, 32)
    spread = weight.view(48, 4, 32)
    span = spread.amax(-1) - spread.amin(-1) if method == "int4" else spread.abs().amax(-1)
    assert (error <= bound * span[..., None] * 1.01 + 1e-6).all()
    with pytest.raises(ValueError, match="multiples of 32"):
        quantize_for_triton(torch.randn(8, 40), method)


def test_the_choice_follows_the_device_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert uses_triton_weights("cpu")  # forced, and the interpreter is on
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not uses_triton_weights("cpu")
    monkeypatch.delenv("PAGEDLLM_QUANTIZED_MATMUL")
    assert uses_triton_weights("cuda") and not uses_triton_weights("cpu")
    monkeypatch.setenv("PAGEDLLM_QUANTIZED_MATMUL", "native")
    assert not uses_triton_weights("cuda")
    monkeypatch.setenv("PAGEDLLM_QUANTIZED_MATMUL", "fast")
    with pytest.raises(ValueError, match="PAGEDLLM_QUANTIZED_MATMUL"):
        uses_triton_weights("cuda")
