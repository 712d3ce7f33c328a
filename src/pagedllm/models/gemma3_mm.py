"""Gemma 3 with images: a SigLIP tower (its normed last layer), the soft-token projector
(patches average-pooled to `mm_tokens_per_image`, RMS-normed, projected) and the Gemma 3
text model. An image's soft tokens attend to each other both ways (the layout marks them
`bidirectional`: the scheduler computes them in one step and the runner gives their
attention each token's key bound); their embeddings are not scaled like the text's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedllm.models.vision_language import VisionLanguageModel
from pagedllm.models.vision_towers import SiglipVisionTower


class Gemma3Projector(nn.Module):
    """Vision patches → `mm_tokens_per_image` soft tokens in the text's width."""

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        vision = hf_config.vision_config
        self.mm_input_projection_weight = nn.Parameter(
            torch.zeros(vision.hidden_size, hf_config.text_config.hidden_size)
        )
        self.mm_soft_emb_norm = Gemma3VisionNorm(vision.hidden_size, vision.layer_norm_eps)
        self.patches_per_side = vision.image_size // vision.patch_size
        tokens_per_side = int(hf_config.mm_tokens_per_image**0.5)
        self.pool = nn.AvgPool2d(self.patches_per_side // tokens_per_side)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[B, patches, vision hidden] → [B, soft tokens, text hidden]."""
        batch, _, hidden = patches.shape
        grid = patches.transpose(1, 2).reshape(
            batch, hidden, self.patches_per_side, self.patches_per_side
        )
        pooled = self.pool(grid.contiguous()).flatten(2).transpose(1, 2)
        normed = self.mm_soft_emb_norm(pooled)
        return torch.matmul(normed, self.mm_input_projection_weight).type_as(patches)


class Gemma3VisionNorm(nn.Module):
    """Gemma's RMSNorm, x * (1 + w), computed in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised over the last dimension."""
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class Gemma3ForConditionalGeneration(VisionLanguageModel):
    """HF `Gemma3ForConditionalGeneration` (images and text) over the paged KV cache."""

    vision_modules = ("vision_tower", "multi_modal_projector")

    def __init__(self, hf_config: Any) -> None:
        super().__init__(hf_config)
        self.vision_tower = SiglipVisionTower(hf_config.vision_config)
        self.multi_modal_projector = Gemma3Projector(hf_config)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] → [B, mm_tokens_per_image, text hidden]."""
        return self.multi_modal_projector(self.vision_tower(pixel_values)[0])
