"""Vision transformers that turn images into patch features: CLIP's and SigLIP's.

Both are pre-norm ViTs over non-overlapping patches (a strided convolution), with learned
absolute position embeddings; CLIP adds a class token and a norm before the layers, SigLIP
neither. The towers attend bidirectionally over one image's patches (layers.attention's
image_attention: no KV cache, images are encoded once and their outputs cached by the
runner). Module and parameter names are transformers' (`embeddings.patch_embedding`,
`encoder.layers.N.self_attn.q_proj`...), so checkpoints load by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from pagedllm.layers.activation import Activation
from pagedllm.layers.attention import image_attention
from pagedllm.models.spec import activation_of


class VisionAttention(nn.Module):
    """Multi-head self-attention over one image's tokens (with biases)."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, hidden] → [B, N, hidden]."""
        batch, num_tokens, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # [B, N, heads, head_dim]
            return t.view(batch, num_tokens, self.num_heads, self.head_dim)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = image_attention(q, k, v)
        return self.out_proj(out.reshape(batch, num_tokens, -1))


class VisionMLP(nn.Module):
    """fc1 → activation → fc2."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        self.act = Activation(activation_of(act))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., hidden] → [..., hidden]."""
        return self.fc2(self.act(self.fc1(x)))


class VisionEncoderLayer(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        eps = config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.self_attn = VisionAttention(config.hidden_size, config.num_attention_heads)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = VisionMLP(config.hidden_size, config.intermediate_size, config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, hidden] → [B, N, hidden]."""
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    """The layer stack; `num_layers` may stop early (a feature layer before the last)."""

    def __init__(self, config: Any, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionEncoderLayer(config) for _ in range(num_layers))

    def forward(self, x: torch.Tensor, keep: Iterable[int] = ()) -> list[torch.Tensor]:
        """The hidden states after the layers, and before/after each index in `keep` as
        transformers numbers them (0: the input, i: after layer i)."""
        keep = set(keep)
        states = [x] if 0 in keep else []
        for index, layer in enumerate(self.layers, start=1):
            x = layer(x)
            if index in keep:
                states.append(x)
        return states or [x]


def feature_layers(vision_feature_layer: int | list[int], num_hidden_layers: int) -> list[int]:
    """transformers' hidden-state indices (0..num_hidden_layers) of the feature layer(s)."""
    layers = vision_feature_layer if isinstance(vision_feature_layer, list) else [
        vision_feature_layer
    ]
    return [layer if layer >= 0 else num_hidden_layers + 1 + layer for layer in layers]


class CLIPVisionTower(nn.Module):
    """CLIP's vision transformer up to its deepest feature layer (`vision_tower.` in LLaVA).

    Args:
        config: a transformers CLIPVisionConfig.
        keep: the hidden-state indices to return (feature_layers()).
    """

    def __init__(self, config: Any, keep: list[int]) -> None:
        super().__init__()
        self.keep = keep
        size = config.hidden_size
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(size, eps=config.layer_norm_eps)
        self.encoder = VisionEncoder(config, max(keep))

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """[B, 3, H, W] → the kept hidden states, each [B, 1 + patches, hidden]."""
        x = self.pre_layrnorm(self.embeddings(pixel_values))
        return self.encoder(x, self.keep)


class CLIPVisionEmbeddings(nn.Module):
    """Patch convolution (no bias), a class token, learned positions."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        size, patch = config.hidden_size, config.patch_size
        self.class_embedding = nn.Parameter(torch.empty(size))
        self.patch_embedding = nn.Conv2d(
            config.num_channels, size, kernel_size=patch, stride=patch, bias=False
        )
        num_positions = (config.image_size // patch) ** 2 + 1
        self.position_embedding = nn.Embedding(num_positions, size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] → [B, 1 + patches, hidden]."""
        weight = self.patch_embedding.weight
        patches = self.patch_embedding(pixel_values.to(weight.dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class SiglipVisionEmbeddings(nn.Module):
    """Patch convolution (with bias) and learned positions; no class token."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        size, patch = config.hidden_size, config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, size, kernel_size=patch,
                                         stride=patch)
        self.position_embedding = nn.Embedding((config.image_size // patch) ** 2, size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] → [B, patches, hidden]."""
        weight = self.patch_embedding.weight
        patches = self.patch_embedding(pixel_values.to(weight.dtype)).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight


class SiglipVisionTower(nn.Module):
    """SigLIP's vision transformer; `post_layernorm` applies when the last layer is kept
    (Gemma 3 reads the normed last state; LLaVA a raw hidden state).

    Args:
        config: a transformers SiglipVisionConfig.
        keep: the hidden-state indices to return; None: the last layer, post-normed.
    """

    def __init__(self, config: Any, keep: list[int] | None = None) -> None:
        super().__init__()
        self.post_norm = keep is None
        self.keep = keep if keep is not None else [config.num_hidden_layers]
        self.embeddings = SiglipVisionEmbeddings(config)
        self.encoder = VisionEncoder(config, max(self.keep))
        self.post_layernorm: nn.Module | None = None
        if self.post_norm:
            self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """[B, 3, H, W] → the kept hidden states, each [B, patches, hidden]."""
        states = self.encoder(self.embeddings(pixel_values), self.keep)
        if self.post_layernorm is not None:
            states = [self.post_layernorm(states[-1])]
        return states


def make_vision_tower(config: Any, keep: list[int] | None) -> nn.Module:
    """The tower a vision config names (CLIP or SigLIP).

    Raises:
        ValueError: for any other vision model.
    """
    model_type = getattr(config, "model_type", None)
    if model_type == "clip_vision_model":
        return CLIPVisionTower(config, keep or [config.num_hidden_layers])
    if model_type == "siglip_vision_model":
        return SiglipVisionTower(config, keep)
    raise ValueError(
        f"Vision tower {model_type!r} is not supported (CLIP and SigLIP are)."
    )
