"""LLaVA: a CLIP or SigLIP vision tower, a two-layer projector, a Llama / Mistral / Qwen2
text model; each image becomes the projected patch features of one tower layer (or
several, side by side), the class token dropped under the "default" strategy."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedllm.layers.activation import Activation
from pagedllm.models.spec import activation_of
from pagedllm.models.vision_language import VisionLanguageModel
from pagedllm.models.vision_towers import feature_layers, make_vision_tower


class LlavaProjector(nn.Module):
    """linear_1 → activation → linear_2: vision features → text embeddings."""

    def __init__(self, in_size: int, out_size: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_size, out_size, bias=bias)
        self.act = Activation(activation_of(act))
        self.linear_2 = nn.Linear(out_size, out_size, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., vision hidden × layers] → [..., text hidden]."""
        return self.linear_2(self.act(self.linear_1(features)))


class LlavaForConditionalGeneration(VisionLanguageModel):
    """HF `LlavaForConditionalGeneration` over the paged KV cache."""

    vision_modules = ("vision_tower", "multi_modal_projector")

    def __init__(self, hf_config: Any) -> None:
        super().__init__(hf_config)
        vision = hf_config.vision_config
        strategy = hf_config.vision_feature_select_strategy
        if strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy {strategy!r} is not supported.")
        self.drop_class_token = strategy == "default"
        layers = feature_layers(hf_config.vision_feature_layer, vision.num_hidden_layers)
        self.vision_tower = make_vision_tower(vision, layers)
        self.multi_modal_projector = LlavaProjector(
            vision.hidden_size * len(layers), hf_config.text_config.hidden_size,
            hf_config.projector_hidden_act, getattr(hf_config, "multimodal_projector_bias", True),
        )

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] → [B, patches, text hidden]."""
        states = self.vision_tower(pixel_values)
        if self.drop_class_token:  # the first token, whatever the tower (as transformers)
            states = [state[:, 1:] for state in states]
        return self.multi_modal_projector(torch.cat(states, dim=-1))
