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
    def fallback_processor(model_dir: str) -> Any:
        """The processor when transformers cannot build the checkpoint's own here (a
        missing optional dependency); None: there is none, the error stands."""
        return None

    @staticmethod
    @abstractmethod
    def max_tokens_per_item(hf_config: Any) -> int:
        """The most embedding rows one item can take (the encoder budget's floor)."""

    @abstractmethod
    def placeholder(self, modality: str) -> str:
        """The text that stands for one item in a prompt."""

    def count_placeholders(self, prompt: str, modality: str) -> int:
        """How many items of `modality` the prompt's text stands for."""
        return prompt.count(self.placeholder(modality))

    @abstractmethod
    def item_inputs(
        self, modality: str, outputs: Mapping[str, torch.Tensor], count: int
    ) -> list[dict[str, torch.Tensor]]:
        """The processor's batched outputs → each item's encoder inputs."""

    @abstractmethod
    def spans(
        self, modality: str, input_ids: list[int], count: int,
        outputs: Mapping[str, torch.Tensor],
    ) -> list[tuple[int, int, list[bool] | None]]:
        """Each item's (offset, length, is_embed) in the processed prompt (`outputs`: the
        processor's, for items whose size they tell)."""


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
        self, modality: str, input_ids: list[int], count: int,
        outputs: Mapping[str, torch.Tensor],
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
        self, modality: str, input_ids: list[int], count: int,
        outputs: Mapping[str, torch.Tensor],
    ) -> list[tuple[int, int, list[bool] | None]]:
        """The soft-token runs, in order."""
        config = self.hf_config
        token_id = getattr(config, "image_token_id", None)
        if token_id is None:
            token_id = config.image_token_index
        return [(offset, length, None) for offset, length in token_runs(input_ids, token_id)]


def sized_runs(input_ids: list[int], token_id: int, sizes: list[int]) -> list[tuple[int, int]]:
    """(offset, size) of consecutive items of known sizes in the runs of `token_id` (two
    items may touch: a run is cut where the next item starts)."""
    spans: list[tuple[int, int]] = []
    runs = iter(token_runs(input_ids, token_id))
    offset = length = 0
    for size in sizes:
        if length == 0:
            offset, length = next(runs, (0, 0))
        if length < size:
            return spans  # fewer tokens than items: the caller reports the mismatch
        spans.append((offset, size))
        offset, length = offset + size, length - size
    return spans


class TokenExpander:
    """transformers' image processor (and a video processor), the tokenizer, and the prompt
    replacement of a processor whose class cannot be built here (Qwen2-VL's needs
    torchvision for its video processor): the i-th placeholder token of a modality becomes
    `count(outputs, i)` of itself.

    Args:
        tokenizer: the checkpoint's tokenizer.
        parts: processor argument ("images", "videos") → (its processor, its placeholder
            token, the count of item i's tokens from the processor's outputs).
        video_only_kwargs: options only the video processor takes (`fps`).
    """

    def __init__(self, tokenizer: Any, parts: dict[str, tuple[Any, str, Any]],
                 video_only_kwargs: tuple[str, ...] = ("fps",)) -> None:
        self.tokenizer = tokenizer
        self.parts = parts
        self.video_only_kwargs = video_only_kwargs
        self.image_token = parts["images"][1]
        self.video_token = parts["videos"][1] if "videos" in parts else None

    def __call__(self, text: list[str], return_tensors: str = "pt",
                 add_special_tokens: bool = True, **kwargs: Any) -> dict[str, Any]:
        """input_ids and the processors' outputs, as the processor would give them."""
        items = {name: kwargs.pop(name) for name in self.parts if name in kwargs}
        video_kwargs = {k: kwargs.pop(k) for k in self.video_only_kwargs if k in kwargs}
        outputs: dict[str, Any] = {}
        prompt = text[0]
        for name, values in items.items():
            if not values:
                continue
            processor, token, count = self.parts[name]
            options = {**kwargs, **(video_kwargs if name == "videos" else {})}
            produced = processor(**{name: values}, return_tensors="pt", **options)
            outputs.update(produced)
            pieces = prompt.split(token)
            prompt = pieces[0] + "".join(
                token * count(produced, i) + piece for i, piece in enumerate(pieces[1:])
            )
        ids = self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
        outputs["input_ids"] = torch.tensor([ids])
        return outputs


class Qwen2VLLayout(PromptLayout):
    """Qwen2-VL: each `<|image_pad|>` (`<|video_pad|>`), between `<|vision_start|>` and
    `<|vision_end|>`, becomes one token per 2 x 2 merged patches of the item's grid;
    pixel_values (pixel_values_videos) holds every item's patches one after another,
    image_grid_thw (video_grid_thw) each item's (t, h, w)."""

    modalities = {"image": "images", "video": "videos"}
    _KEYS = {"image": ("pixel_values", "image_grid_thw", "image_token_id"),
             "video": ("pixel_values_videos", "video_grid_thw", "video_token_id")}

    @staticmethod
    def max_tokens_per_item(hf_config: Any) -> int:
        """Tokens of the largest image the default processor makes (max_pixels 12845056
        at 14 px patches, 2 x 2 merged)."""
        return 12845056 // (14 * 14) // 4

    @staticmethod
    def fallback_processor(model_dir: str) -> TokenExpander:
        """Without torchvision (Qwen2VLProcessor's video half needs it): the image
        processor, video frames cut by multimodal/video.py over it, the tokenizer, and the
        processor's replacement of `<|image_pad|>` / `<|video_pad|>` by one token per
        merged patch."""
        from transformers import AutoImageProcessor, AutoTokenizer

        from pagedllm.multimodal.video import QwenVideoProcessor

        image_processor = AutoImageProcessor.from_pretrained(model_dir)
        merge = int(image_processor.merge_size)

        def counter(grid_key: str) -> Any:
            def count(outputs: Mapping[str, torch.Tensor], index: int) -> int:
                return int(outputs[grid_key][index].prod()) // (merge * merge)
            return count

        return TokenExpander(AutoTokenizer.from_pretrained(model_dir), {
            "images": (image_processor, "<|image_pad|>", counter("image_grid_thw")),
            "videos": (QwenVideoProcessor(image_processor), "<|video_pad|>",
                       counter("video_grid_thw")),
        })

    def _token(self, modality: str) -> str:
        return str(self.hf_processor.image_token if modality == "image"
                   else self.hf_processor.video_token)

    def placeholder(self, modality: str) -> str:
        """The vision block the chat template writes for an image or a video."""
        return f"<|vision_start|>{self._token(modality)}<|vision_end|>"

    def count_placeholders(self, prompt: str, modality: str) -> int:
        """`<|image_pad|>` (`<|video_pad|>`) tokens in the prompt."""
        return prompt.count(self._token(modality))

    def _grids(self, modality: str, outputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return outputs[self._KEYS[modality][1]].reshape(-1, 3)

    def item_inputs(
        self, modality: str, outputs: Mapping[str, torch.Tensor], count: int
    ) -> list[dict[str, torch.Tensor]]:
        """Each item's patches and grid (a video's: its seconds per temporal patch too,
        Qwen2.5-VL's temporal positions)."""
        pixel_key, grid_key, _ = self._KEYS[modality]
        grids = self._grids(modality, outputs)
        sizes = [int(t * h * w) for t, h, w in grids.tolist()]
        patches = outputs[pixel_key].split(sizes)
        items = [{pixel_key: patches[i], grid_key: grids[i : i + 1]} for i in range(count)]
        seconds = outputs.get("second_per_grid_ts") if modality == "video" else None
        if seconds is not None:
            seconds = torch.as_tensor(seconds, dtype=torch.float32).reshape(-1)
            for i, item in enumerate(items):
                item["second_per_grid_ts"] = seconds[i : i + 1]
        return items

    def spans(
        self, modality: str, input_ids: list[int], count: int,
        outputs: Mapping[str, torch.Tensor],
    ) -> list[tuple[int, int, list[bool] | None]]:
        """Runs of pad tokens, one per item, sized by its grid."""
        merge = self.hf_config.vision_config.spatial_merge_size
        grids = self._grids(modality, outputs)
        sizes = [int(t * h * w) // (merge * merge) for t, h, w in grids.tolist()]
        token_id = int(getattr(self.hf_config, self._KEYS[modality][2]))
        return [(offset, size, None) for offset, size in sized_runs(input_ids, token_id, sizes)]


class Idefics3Layout(PromptLayout):
    """Idefics3 / SmolVLM: `<image>` becomes, per crop, row/column tags (text) and
    `image_seq_len` image tokens, the global view's run last (after `<global-img>`);
    pixel_values holds every image's crops one after another."""

    @staticmethod
    def max_tokens_per_item(hf_config: Any) -> int:
        """The processor's default split: up to 4 x 4 tiles and the global view, each
        (image_size / patch_size / scale_factor)² tokens."""
        vision = hf_config.vision_config
        per_crop = (vision.image_size // vision.patch_size // hf_config.scale_factor) ** 2
        return 17 * per_crop

    def placeholder(self, modality: str) -> str:
        """The processor's image token (`<image>`)."""
        return str(self.hf_processor.image_token)

    def _image_runs(self, input_ids: list[int]) -> list[list[tuple[int, int]]]:
        """The image-token runs, grouped by image: an image ends with its global view."""
        tokenizer = self.hf_processor.tokenizer
        global_id = tokenizer.convert_tokens_to_ids("<global-img>")
        images: list[list[tuple[int, int]]] = [[]]
        for offset, length in token_runs(input_ids, int(self.hf_config.image_token_id)):
            images[-1].append((offset, length))
            if offset > 0 and input_ids[offset - 1] == global_id:
                images.append([])
        return [runs for runs in images if runs]

    def item_inputs(
        self, modality: str, outputs: Mapping[str, torch.Tensor], count: int
    ) -> list[dict[str, torch.Tensor]]:
        """Each image's crops (their count read from the prompt's runs)."""
        mask = outputs.get("pixel_attention_mask")
        if mask is not None and not bool(mask.all()):
            raise ValueError("Idefics3 crops padded inside an image are not supported.")
        crops = outputs["pixel_values"][0]
        sizes = [len(runs) for runs in self._image_runs(outputs["input_ids"][0].tolist())]
        return [{"pixel_values": part} for part in crops[: sum(sizes)].split(sizes)]

    def spans(
        self, modality: str, input_ids: list[int], count: int,
        outputs: Mapping[str, torch.Tensor],
    ) -> list[tuple[int, int, list[bool] | None]]:
        """From each image's first run to its last; tags between runs are text."""
        token_id = int(self.hf_config.image_token_id)
        spans: list[tuple[int, int, list[bool] | None]] = []
        for runs in self._image_runs(input_ids):
            start, end = runs[0][0], runs[-1][0] + runs[-1][1]
            spans.append((start, end - start, [t == token_id for t in input_ids[start:end]]))
        return spans


_LAYOUTS: dict[str, type[PromptLayout]] = {
    "LlavaForConditionalGeneration": LlavaLayout,
    "Gemma3ForConditionalGeneration": Gemma3Layout,
    "Qwen2VLForConditionalGeneration": Qwen2VLLayout,
    "Qwen2_5_VLForConditionalGeneration": Qwen2VLLayout,
    "Idefics3ForConditionalGeneration": Idefics3Layout,
}


def layout_class(architecture: str) -> type[PromptLayout] | None:
    """The layout of a vision-language architecture; None for a text-only one."""
    return _LAYOUTS.get(architecture)
