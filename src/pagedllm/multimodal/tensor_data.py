"""Tensors to and from `TensorData`, the wire form of an item's encoder inputs."""

from __future__ import annotations

import torch

from pagedllm.multimodal.inputs import MultiModalFeature, TensorData


def to_tensor_data(tensor: torch.Tensor) -> TensorData:
    """The tensor's bytes (made contiguous, on the host)."""
    tensor = tensor.detach().to("cpu").contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    return TensorData(dtype, list(tensor.shape), raw)


def from_tensor_data(data: TensorData) -> torch.Tensor:
    """The tensor again (a fresh host tensor)."""
    dtype = getattr(torch, data.dtype)
    if not data.data:
        return torch.empty(data.shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(data.data), dtype=torch.uint8)
    return flat.view(dtype).reshape(data.shape)


def feature_tensors(feature: MultiModalFeature) -> dict[str, torch.Tensor]:
    """An item's encoder inputs as host tensors."""
    return {name: from_tensor_data(value) for name, value in feature.data.items()}
