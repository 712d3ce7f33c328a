"""Q5_0, Q4_K, Q5_K and Q6_K blocks unpacked into codes and scales give back exactly the values
the gguf package's reference dequantization computes (random blocks, every bit pattern of
the packed fields exercised), and become the byte dot-product weights without a change."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization import (
    SplitWeight,
    W4A8Weight,
    w4a8_from_codes,
    w8a8_from_codes,
)
from pagedllm.model_loader.k_quants import K_QUANT_DECODERS

# Byte offsets of each format's float16 fields within its block, and the block size.
_HALVES = {
    "Q5_0": ([0], 22), "Q4_K": ([0, 2], 144), "Q5_K": ([0, 2], 176), "Q6_K": ([208], 210)
}


def _random_rows(type_name: str, rows: int, values: int, seed: int) -> np.ndarray:
    """Random blocks with finite float16 scales: [rows, row_bytes] uint8."""
    offsets, block_bytes = _HALVES[type_name]
    block_values = 32 if type_name == "Q5_0" else 256
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, values // block_values, block_bytes), dtype=np.uint8)
    for at in offsets:
        halves = rng.uniform(-0.05, 0.05, blocks.shape[:2]).astype(np.float16)
        blocks[..., at : at + 2] = halves[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(K_QUANT_DECODERS))
def test_codes_equal_reference_dequantization(type_name: str) -> None:
    data = _random_rows(type_name, rows=24, values=512, seed=len(type_name))
    qtype = gguf.GGMLQuantizationType[type_name]
    reference = torch.from_numpy(np.asarray(gguf.quants.dequantize(data, qtype), np.float32))
    codes = K_QUANT_DECODERS[type_name](data)
    assert codes.shape == (24, 512)
    assert torch.equal(codes.dense(torch.float32), reference.view(24, 512))


@pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no C compiler for the kernels")
@pytest.mark.parametrize("type_name", sorted(K_QUANT_DECODERS))
def test_byte_dot_weights_hold_the_file_values(type_name: str) -> None:
    """Q4_K → W4A8, Q5_0 → W8A8, Q6_K → two W8A8 halves, Q5_K → two W4A8 (low nibbles and
    fifth bits): dense() is the file's values, and
    the matmul is close to the float32 product (activations are int8 in the kernel)."""
    data = _random_rows(type_name, rows=32, values=256, seed=3)
    codes = K_QUANT_DECODERS[type_name](data)
    weight = w4a8_from_codes(codes) if codes.is_int4 else w8a8_from_codes(codes)
    assert isinstance(weight, SplitWeight) == (type_name in ("Q5_K", "Q6_K"))
    assert isinstance(weight, W4A8Weight) == (type_name == "Q4_K")
    dense = codes.dense(torch.float32)
    assert torch.equal(weight.dense(torch.float32), dense)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    expected = x.float() @ dense.T
    got = weight.matmul(x).float()
    assert (got - expected).abs().max() <= 0.03 * expected.abs().max()
