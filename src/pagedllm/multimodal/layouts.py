"""How each vision-language architecture's processor lays its items out in the prompt.

transformers' own processor (AutoProcessor of the checkpoint) expands each placeholder of
the prompt into the item's feature tokens and returns the encoder's inputs; a
`PromptLayout` knows, for one architecture, which placeholder text the user (or a chat
part) writes, which outputs belong to which item, and where each item's tokens landed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch


class PromptLayout(ABC):
    """One architecture's placement of multimodal items.

    Args:
        hf_config: the model's transformers config.
        hf_processor: its transformers processor.
    """

    # Modalities the model reads, and the processor argument each is passed as.
    modalities: dict[str, str] = {"image": "images"}
    # Item tokens attend to each other both ways (their tokens go in one step).
    bidirectional = False

    def __init__(self, hf_config: Any, hf_processor: Any) -> None:
        self.hf_config = hf_config
        self.hf_processor = hf_processor

    @staticmethod
    @abstractmethod
    def max_tokens_per_item(hf_config: Any) -> int:
        """The most embedding rows one item can take (the encoder budget's floor)."""

    @abstractmethod
    def placeholder(self, modality: str) -> str:
        """The text that stands for one item in a prompt."""

    @abstractmethod
    def item_inputs(
        self, modality: str, outputs: Mapping[str, torch.Tensor], count: int
    ) -> list[dict[str, torch.Tensor]]:
        """The processor's batched outputs → each item's encoder inputs."""

    @abstractmethod
    def spans(
        self, modality: str, input_ids: list[int], count: int
    ) -> list[tuple[int, int, list[bool] | None]]:
        """Each item's (offset, length, is_embed) in the processed prompt."""


def token_runs(input_ids: list[int], token_id: int) -> list[tuple[int, int]]:
    """(offset, length) of every maximal run of `token_id`."""
    runs: list[tuple[int, int]] = []
    start = None
    for index, token in enumerate([*input_ids, -1]):
        if token == token_id and start is None:
            start = index
        elif token != token_id and start is not None:
            runs.append((start, index - start))
            start = None
    return runs


class LlavaLayout(PromptLayout):
    """LLaVA: `<image>` becomes one run of image tokens per image; pixel_values has one
    row per image."""

    @staticmethod
    def max_tokens_per_item(hf_config: Any) -> int:
        """One row per patch (and the class token under "full" on CLIP)."""
        vision = hf_config.vision_config
        count = (vision.image_size // vision.patch_size) ** 2
        if getattr(vision, "model_type", "") == "clip_vision_model":
            count += 1
        if hf_config.vision_feature_select_strategy == "default":
            count -= 1
        return int(count)

    def placeholder(self, modality: str) -> str:
        """The processor's image token (`<image>`)."""
        return str(self.hf_processor.image_token)

    def _token_id(self) -> int:
        config = self.hf_config
        token_id = getattr(config, "image_token_id", None)
        return int(token_id if token_id is not None else config.image_token_index)

    def item_inputs(
        self, modality: str, outputs: Mapping[str, torch.Tensor], count: int
    ) -> list[dict[str, torch.Tensor]]:
        """One pixel_values row per image."""
        pixels = outputs["pixel_values"]
        return [{"pixel_values": pixels[i : i + 1]} for i in range(count)]

    def spans(
        self, modality: str, input_ids: list[int], count: int
    ) -> list[tuple[int, int, list[bool] | None]]:
        """The image-token runs, in order."""
        return [(offset, length, None) for offset, length in token_runs(input_ids,
                                                                        self._token_id())]


class Gemma3Layout(PromptLayout):
    """Gemma 3: `<start_of_image>` becomes blank lines, itself, `mm_tokens_per_image` soft
    tokens and `<end_of_image>`; the soft tokens attend to each other both ways."""

    bidirectional = True

    @staticmethod
    def max_tokens_per_item(hf_config: Any) -> int:
        """Every image is `mm_tokens_per_image` soft tokens."""
        return int(hf_config.mm_tokens_per_image)

    def placeholder(self, modality: str) -> str:
        """The begin-of-image token the user writes (`<start_of_image>`)."""
        return str(self.hf_processor.boi_token)

    def item_inputs(
        self, modality: str, outputs: Mapping[str, torch.Tensor], count: int
    ) -> list[dict[str, torch.Tensor]]:
        """One pixel_values row per image (pan-and-scan crops are not built)."""
        pixels = outputs["pixel_values"]
        if pixels.shape[0] != count:
            raise ValueError("Gemma 3 pan-and-scan crops (do_pan_and_scan) are not supported.")
        return [{"pixel_values": pixels[i : i + 1]} for i in range(count)]

    def spans(
        self, modality: str, input_ids: list[int], count: int
    ) -> list[tuple[int, int, list[bool] | None]]:
        """The soft-token runs, in order."""
        config = self.hf_config
        token_id = getattr(config, "image_token_id", None)
        if token_id is None:
            token_id = config.image_token_index
        return [(offset, length, None) for offset, length in token_runs(input_ids, token_id)]


_LAYOUTS: dict[str, type[PromptLayout]] = {
    "LlavaForConditionalGeneration": LlavaLayout,
    "Gemma3ForConditionalGeneration": Gemma3Layout,
}


def layout_class(architecture: str) -> type[PromptLayout] | None:
    """The layout of a vision-language architecture; None for a text-only one."""
    return _LAYOUTS.get(architecture)
