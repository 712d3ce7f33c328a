"""The oneDNN-packed bf16 matmul runs on a bounded set of row counts.

oneDNN compiles and caches a kernel per input shape; before rows were bucketed, every new
batch size of a serving run built new kernels and the engine core's resident memory grew
for as long as new sizes kept coming (+28% in a 10-minute soak).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.layers.quantization.dense import (
    can_pack_for_cpu,
    pack_weight_for_cpu,
    packed_linear,
    packed_rows,
)


def test_packed_rows_are_few_and_cover_every_batch() -> None:
    sizes = {packed_rows(rows) for rows in range(1, 2049)}
    assert len(sizes) == 55
    for rows in range(1, 4097):
        padded = packed_rows(rows)
        assert padded >= rows
        assert packed_rows(padded) == padded  # a bucket is its own bucket
        if rows <= 16:
            assert padded == rows
        elif rows > 128:
            assert padded <= rows * 1.125


def _bf16_weight() -> torch.Tensor:
    weight = torch.randn(96, 64, dtype=torch.bfloat16)
    if not can_pack_for_cpu(weight):
        pytest.skip("oneDNN bf16 matmuls are not native on this CPU: nothing is packed")
    return weight


def test_onednn_sees_only_bucketed_row_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _bf16_weight()
    packed = pack_weight_for_cpu(weight)
    seen: set[int] = set()
    real = torch.ops.mkldnn._linear_pointwise

    def recording(x: torch.Tensor, *args: object) -> torch.Tensor:
        seen.add(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", recording)
    for rows in range(100, 300):
        out = packed_linear(torch.randn(rows, 64, dtype=torch.bfloat16), packed, None)
        assert out.shape == (rows, 96) and out.is_contiguous()
    assert seen == {packed_rows(rows) for rows in range(100, 300)}
    assert len(seen) == 12  # not 200: 112..256 by 16, 288, 320


def test_padded_rows_give_the_unpadded_batch_result() -> None:
    torch.manual_seed(0)
    weight = _bf16_weight()
    bias = torch.randn(96, dtype=torch.bfloat16)
    packed = pack_weight_for_cpu(weight)
    x = torch.randn(37, 64, dtype=torch.bfloat16)
    out = packed_linear(x, packed, bias)
    padded = torch.cat((x, torch.zeros(packed_rows(37) - 37, 64, dtype=torch.bfloat16)))
    assert torch.equal(out, packed_linear(padded, packed, bias)[:37])
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight.float(), bias.float()),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_a_packed_layer_holds_the_weight_once(quantization: str | None, bf16_panels) -> None:
    """A dense layer whose weight is packed keeps only the packed copy (the plain one is
    freed: the model is not held twice), and computes what the plain weight did; with
    torch's weight-only int8 the packed copy serves the large steps. (Our kernel's panels
    off: test_bf16_panels.py has that layout.)"""
    from pagedllm.layers.linear import Linear
    from pagedllm.layers.quantization import PackedDenseMethod

    bf16_panels("never")
    weight = _bf16_weight()
    layer = Linear(64, 96)
    layer.weight.data = weight.clone()
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    want = packed_linear(x, pack_weight_for_cpu(weight), None)
    layer.process_weights_after_loading(quantization, keep_dense=True)
    assert layer.weight.numel() == 0 and layer.keeps_dense
    method = layer.method
    large = method if quantization is None else method.large  # type: ignore[attr-defined]
    assert isinstance(large, PackedDenseMethod)
    torch.testing.assert_close(layer(x), want, atol=0, rtol=0)
    torch.testing.assert_close(layer(x), F.linear(x, weight), atol=5e-2, rtol=2e-2)
