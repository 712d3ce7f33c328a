"""What every vision-language model here shares: a text decoder of a supported
architecture, a vision encoder beside it, and the merge of the two in the forward.

A `VisionLanguageModel` is the text model's `DecoderForCausalLM` (same layers, KV cache,
LM head and decode paths; built from the text config's spec) plus the modules a subclass
adds for images. The runner passes the encoder outputs a step needs as `mm_embeds`; they
replace the placeholder tokens' text embeddings before the first layer. Checkpoint names
are normalised from both of transformers' layouts (`language_model.model.*` of the
original checkpoints, `model.language_model.*` of transformers 5) onto ours (`model.*`,
`lm_head.*`, and the vision modules' own names).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pagedllm.layers.linear import default_weight_loader
from pagedllm.models.common import DecoderForCausalLM, Weight
from pagedllm.models.spec import DecoderSpec

# Checkpoint prefixes → ours, longest first.
_TEXT_PREFIXES = (
    ("model.language_model.", "model."),
    ("model.text_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("language_model.", "model."),
)


def text_spec(text_config: Any, text_class: type | None = None) -> DecoderSpec:
    """The decoder spec the text config's own architecture (or `text_class`) builds (on
    the meta device: no memory)."""
    from pagedllm.models.registry import resolve_model_class, text_architecture

    if text_class is None:
        text_class = resolve_model_class(text_architecture(text_config))
    with torch.device("meta"):
        return text_class(text_config).spec


class VisionLanguageModel(DecoderForCausalLM):
    """A text decoder plus vision modules (`vision_prefixes` name them in checkpoints).

    Subclasses build their vision modules in `__init__` and implement `image_features`
    (or `encode` for inputs other than one pixel tensor per image).
    """

    supports_multimodal = True
    # Our module names of the vision side; checkpoint names are mapped onto them.
    vision_modules: tuple[str, ...] = ()
    # The text decoder's class (None: the text config's own architecture).
    text_model_class: type | None = None
    # Positions are (temporal, height, width) triples (M-RoPE): `mrope_positions`.
    uses_mrope = False

    def __init__(self, hf_config: Any) -> None:
        super().__init__(text_spec(hf_config.text_config, self.text_model_class))

    def encode(
        self, modality: str, items: list[dict[str, torch.Tensor]]
    ) -> list[torch.Tensor]:
        """Images (pixel_values [1, 3, H, W] each) → their embeddings [num_embeds, hidden],
        images of one size in one batch."""
        if modality != "image":
            raise ValueError(f"{type(self).__name__} takes images, not {modality}.")
        outputs: list[torch.Tensor] = [torch.empty(0)] * len(items)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for index, item in enumerate(items):
            by_shape.setdefault(tuple(item["pixel_values"].shape[1:]), []).append(index)
        for indices in by_shape.values():
            features = self.image_features(torch.cat([items[i]["pixel_values"] for i in indices]))
            for row, index in enumerate(indices):
                outputs[index] = features[row]
        return outputs

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] → [B, tokens per image, text hidden]."""
        raise NotImplementedError

    def remap_weight(self, hf_name: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """Checkpoint names of either transformers layout → ours."""
        name = hf_name.removeprefix("model.") if self._is_vision(
            hf_name.removeprefix("model.")
        ) else hf_name
        if not self._is_vision(name):
            for prefix, ours in _TEXT_PREFIXES:
                if name.startswith(prefix):
                    name = ours + name[len(prefix):]
                    break
        yield name.replace(".vision_model.", "."), tensor

    def _is_vision(self, name: str) -> bool:
        return name.split(".", 1)[0] in self.vision_modules

    def _is_skipped(self, hf_name: str) -> bool:
        if self._is_vision(hf_name):
            return self._vision_param(hf_name) is None
        return super()._is_skipped(hf_name)

    def _vision_param(self, name: str) -> nn.Parameter | None:
        """Our vision parameter of that name; None for checkpoint tensors of layers the
        model does not run (a tower cut at its feature layer, an unused head)."""
        if not hasattr(self, "_vision_params"):
            self._vision_params = {
                name: param for name, param in self.named_parameters()
                if self._is_vision(name)
            }
        return self._vision_params.get(name)

    def _load_one(self, params: dict[str, nn.Parameter], hf_name: str, tensor: Weight) -> str:
        if self._is_vision(hf_name):
            assert isinstance(tensor, torch.Tensor)
            default_weight_loader(params[hf_name], tensor)
            return hf_name
        return super()._load_one(params, hf_name, tensor)
