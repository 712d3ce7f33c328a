"""The frontend's multimodal processor: a prompt with images → token ids and features.

vLLM's prompt replacement, done by the checkpoint's own transformers processor: it
expands each placeholder (`<image>`...) into the item's feature tokens and prepares the
encoder's inputs. Then each item is located in the token ids (layouts.py), hashed
(hashing.py, or named by the caller's `multi_modal_uuids`) and packed as a
`MultiModalFeature` for the engine. Bad inputs raise ValueError naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pagedllm.logger import init_logger
from pagedllm.multimodal.hashing import hash_item, hash_uuid
from pagedllm.multimodal.inputs import MODALITIES, MultiModalFeature
from pagedllm.multimodal.layouts import PromptLayout, layout_class
from pagedllm.multimodal.tensor_data import to_tensor_data

logger = init_logger(__name__)


def supports_multimodal(architecture: str) -> bool:
    """True for an architecture that reads images (or video) here."""
    return layout_class(architecture) is not None


class MultiModalProcessor:
    """Turns `{"prompt", "multi_modal_data"}` into token ids and item features.

    Args:
        model_dir: the checkpoint folder (its transformers processor is loaded from it).
        architecture: HF `architectures[0]`.
        hf_config: the model's transformers config.
        limit_per_prompt: most items of each modality in one prompt (vLLM's
            `limit_mm_per_prompt`; unlisted modalities: no limit but the model's).
        hf_processor: an already loaded processor (else loaded from model_dir).
        default_kwargs: processor options of every request (a request's own win).
    """

    def __init__(
        self, model_dir: str, architecture: str, hf_config: Any,
        limit_per_prompt: Mapping[str, int] | None = None, hf_processor: Any = None,
        default_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        layout = layout_class(architecture)
        if layout is None:
            raise ValueError(f"{architecture} takes no images or video.")
        if hf_processor is None:
            hf_processor = _load_processor(model_dir, layout)
        self.hf_processor = hf_processor
        self.architecture = architecture
        self.layout: PromptLayout = layout(hf_config, hf_processor)
        self.limit_per_prompt = dict(limit_per_prompt or {})
        self.default_kwargs = dict(default_kwargs or {})

    @property
    def modalities(self) -> tuple[str, ...]:
        """What the model reads."""
        return tuple(self.layout.modalities)

    def placeholder(self, modality: str) -> str:
        """The text standing for one item of `modality` in a prompt."""
        return self.layout.placeholder(modality)

    def check_counts(self, counts: Mapping[str, int], where: str = "multi_modal_data") -> None:
        """Refuse a modality the model does not read, or more items than allowed.

        Raises:
            ValueError: naming the modality and the limit.
        """
        for modality, count in counts.items():
            if modality not in self.layout.modalities:
                raise ValueError(
                    f"{where}.{modality}: {self.architecture} does not take {modality} "
                    f"inputs (it takes: {', '.join(self.layout.modalities)})."
                )
            limit = self.limit_per_prompt.get(modality)
            if limit is not None and count > limit:
                raise ValueError(
                    f"At most {limit} {modality}(s) may be provided in one prompt; "
                    f"{where}.{modality} has {count} (raise --limit-mm-per-prompt)."
                )

    def process(
        self, prompt: str, mm_data: Mapping[str, Any], mm_kwargs: Mapping[str, Any] | None = None,
        uuids: Mapping[str, Any] | None = None, add_special_tokens: bool = True,
    ) -> tuple[list[int], list[MultiModalFeature]]:
        """Token ids of the expanded prompt and its items' features, in prompt order.

        Raises:
            ValueError: for a bad item, a count that does not match the prompt's
                placeholders, limits, uuids of the wrong length, or a processor failure.
        """
        items = normalize_mm_data(mm_data)
        self.check_counts({modality: len(values) for modality, values in items.items()})
        for modality, values in items.items():
            found = self.layout.count_placeholders(prompt, modality)
            if found != len(values):
                raise ValueError(
                    f"The prompt has {found} {self.placeholder(modality)!r} placeholder(s) "
                    f"but multi_modal_data.{modality} has {len(values)} item(s)."
                )
        kwargs = {**self.default_kwargs, **(mm_kwargs or {})}
        arguments = {self.layout.modalities[m]: values for m, values in items.items() if values}
        try:
            outputs = self.hf_processor(
                text=[prompt], return_tensors="pt", add_special_tokens=add_special_tokens,
                **arguments, **kwargs,
            )
        except (ValueError, TypeError, OSError) as error:
            raise ValueError(f"multi_modal_data could not be processed: {error}") from None
        input_ids: list[int] = outputs["input_ids"][0].tolist()  # ints, not 0-d tensors
        features: list[MultiModalFeature] = []
        for modality, values in items.items():
            features += self._features(modality, len(values), outputs, input_ids, kwargs,
                                       (uuids or {}).get(modality))
        features.sort(key=lambda feature: feature.offset)
        return input_ids, features

    def _features(
        self, modality: str, count: int, outputs: Mapping[str, torch.Tensor],
        input_ids: list[int], kwargs: Mapping[str, Any], uuids: Any,
    ) -> list[MultiModalFeature]:
        if count == 0:
            return []
        spans = self.layout.spans(modality, input_ids, count, outputs)
        if len(spans) != count:
            raise ValueError(
                f"multi_modal_data.{modality}: {count} item(s) but {len(spans)} placeholder "
                "span(s) in the processed prompt (a prompt truncated by the processor?)."
            )
        uuid_list = _uuid_list(uuids, count, modality)
        features = []
        for index, (inputs, (offset, length, is_embed)) in enumerate(
            zip(self.layout.item_inputs(modality, outputs, count), spans, strict=True)
        ):
            data = {name: to_tensor_data(t) for name, t in inputs.items()}
            uuid = uuid_list[index]
            identifier = (hash_uuid(modality, uuid, kwargs) if uuid is not None
                          else hash_item(modality, data, kwargs))
            features.append(MultiModalFeature(
                modality, identifier, offset, length, is_embed, data, self.layout.bidirectional
            ))
        return features


def _load_processor(model_dir: str, layout: type[PromptLayout]) -> Any:
    """The checkpoint's transformers processor, or the layout's fallback where transformers
    cannot build it (an optional dependency missing)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model_dir)
    except (ImportError, AttributeError, ValueError, OSError) as error:
        fallback = layout.fallback_processor(model_dir)
        if fallback is None:
            raise
        logger.info("Using the image processor and tokenizer of %s without its processor "
                    "class (%s).", model_dir, error)
        return fallback


def normalize_mm_data(mm_data: Any) -> dict[str, list[Any]]:
    """`{"image": item or list, "video": ...}` → modality → list of items, checked.

    Raises:
        ValueError: naming the field, for anything but a mapping of known modalities to
            PIL images, arrays or tensors (a video: a list of frames or a 4-D array).
    """
    if not isinstance(mm_data, Mapping):
        raise ValueError(
            f"multi_modal_data must be a dict such as {{'image': image}}, got "
            f"{type(mm_data).__name__}."
        )
    items: dict[str, list[Any]] = {}
    for modality, value in mm_data.items():
        if modality not in MODALITIES:
            raise ValueError(
                f"multi_modal_data.{modality}: unknown modality (known: "
                f"{', '.join(MODALITIES)})."
            )
        if value is None:
            continue
        values = list(value) if _is_item_list(modality, value) else [value]
        for index, item in enumerate(values):
            _check_item(modality, item, f"multi_modal_data.{modality}[{index}]")
        items[modality] = values
    return items


def _is_item_list(modality: str, value: Any) -> bool:
    """A list of items rather than one item (a video is itself a list of frames)."""
    if not isinstance(value, (list, tuple)):
        return False
    if modality == "video":
        return bool(value) and isinstance(value[0], (list, tuple)) or (
            bool(value) and _is_array(value[0]) and np.ndim(value[0]) == 4
        )
    return True


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, torch.Tensor))


def _check_item(modality: str, item: Any, where: str) -> None:
    from PIL import Image

    if modality == "image":
        if isinstance(item, Image.Image) or (_is_array(item) and np.ndim(item) in (2, 3)):
            return
        raise ValueError(
            f"{where} must be a PIL image or an array of shape (H, W[, C]), got "
            f"{type(item).__name__}."
        )
    frames = item if isinstance(item, (list, tuple)) else None
    if frames is not None and frames and all(
        isinstance(f, Image.Image) or (_is_array(f) and np.ndim(f) == 3) for f in frames
    ):
        return
    if _is_array(item) and np.ndim(item) == 4:
        return
    raise ValueError(
        f"{where} must be a video: a list of frames (PIL images or (H, W, C) arrays) or an "
        f"array of shape (frames, H, W, C), got {type(item).__name__}."
    )


def _uuid_list(uuids: Any, count: int, modality: str) -> list[str | None]:
    """The caller's uuids for the items of one modality (None where not given)."""
    if uuids is None:
        return [None] * count
    values = uuids if isinstance(uuids, (list, tuple)) else [uuids]
    if len(values) != count or any(v is not None and not isinstance(v, str) for v in values):
        raise ValueError(
            f"multi_modal_uuids.{modality} must list {count} string(s) (or None), one per "
            "item."
        )
    return list(values)
