"""Idefics3 / SmolVLM: a SigLIP-like tower over each crop of an image (the processor
splits an image into tiles plus a downscaled global view), patch positions bucketed onto
the tower's grid, pixel shuffle (scale_factor² neighbouring patches concatenated) and one
projection into a Llama text model. An image's tokens are a run of `image_seq_len` per
crop, separated by row/column tags that stay text (the layout's `is_embed`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedllm.models.vision_language import VisionLanguageModel
from pagedllm.models.vision_towers import VisionEncoder


class Idefics3VisionEmbeddings(nn.Module):
    """Patch convolution and learned positions, a crop's patches bucketed onto the
    `image_size` grid the positions were trained on (transformers' rule)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.side = config.image_size // config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size,
                                         kernel_size=config.patch_size, stride=config.patch_size)
        self.position_embedding = nn.Embedding(self.side * self.side, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] (whole crops) → [B, patches, hidden]."""
        weight = self.patch_embedding.weight
        patches = self.patch_embedding(pixel_values.to(weight.dtype)).flatten(2).transpose(1, 2)
        rows, cols = (size // self.patch_size for size in pixel_values.shape[-2:])
        device = pixel_values.device
        boundaries = torch.arange(1 / self.side, 1.0, 1 / self.side, device=device)

        def buckets(count: int) -> torch.Tensor:
            fractions = torch.arange(count, device=device, dtype=torch.float32) * (1.0 / count)
            return torch.bucketize(fractions.clamp(max=1.0 - 1e-6), boundaries, right=True)

        ids = (buckets(rows)[:, None] * self.side + buckets(cols)[None, :]).reshape(-1)
        return patches + self.position_embedding(ids)


class Idefics3VisionTower(nn.Module):
    """Embeddings, the SigLIP-style layers, the post norm (`vision_model.` names)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embeddings = Idefics3VisionEmbeddings(config)
        self.encoder = VisionEncoder(config, config.num_hidden_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] → [B, patches, hidden]."""
        return self.post_layernorm(self.encoder(self.embeddings(pixel_values))[-1])


class Idefics3Connector(nn.Module):
    """Pixel shuffle (scale² patches → one wider token), then a linear projection."""

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        self.scale = hf_config.scale_factor
        width = hf_config.vision_config.hidden_size * self.scale * self.scale
        self.modality_projection = nn.Module()
        self.modality_projection.proj = nn.Linear(  # type: ignore[assignment]
            width, hf_config.text_config.hidden_size, bias=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, patches, hidden] → [B, patches / scale², text hidden]."""
        batch, seq, dim = x.shape
        side, scale = int(seq**0.5), self.scale
        x = x.view(batch, side, side // scale, dim * scale).permute(0, 2, 1, 3)
        x = x.reshape(batch, side // scale, side // scale, dim * scale * scale)
        x = x.permute(0, 2, 1, 3).reshape(batch, seq // (scale * scale), dim * scale * scale)
        return self.modality_projection.proj(x)  # type: ignore[operator]


class Idefics3ForConditionalGeneration(VisionLanguageModel):
    """HF `Idefics3ForConditionalGeneration` (SmolVLM) over the paged KV cache."""

    vision_modules = ("vision_model", "connector")

    def __init__(self, hf_config: Any) -> None:
        super().__init__(hf_config)
        self.vision_model = Idefics3VisionTower(hf_config.vision_config)
        self.connector = Idefics3Connector(hf_config)

    def encode(
        self, modality: str, items: list[dict[str, torch.Tensor]]
    ) -> list[torch.Tensor]:
        """Images (their crops [n, 3, H, W]) → [n * image_seq_len, hidden] each, every
        crop of the step in one pass."""
        if modality != "image":
            raise ValueError(f"Idefics3 takes images, not {modality}.")
        crops = [item["pixel_values"] for item in items]
        tokens = self.connector(self.vision_model(torch.cat(crops)))  # [crops, n, hidden]
        return [t.reshape(-1, t.shape[-1]) for t in tokens.split([c.shape[0] for c in crops])]
