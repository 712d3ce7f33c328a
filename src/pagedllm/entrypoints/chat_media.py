"""Images and videos in chat messages, as `LLM.chat` and the server take them.

Content parts `{"type": "image_url", "image_url": {"url": ...}}` (data:, http(s) or file://
URLs, read by multimodal/media.py), `{"type": "image_pil", "image_pil": image}` and
`{"type": "video_url", ...}` become the prompt's `multi_modal_data`, in order; each part
leaves its placeholder in the message for the chat template. Templates that read content as
a string get vLLM's "string" format (each item's placeholder on its own line before the
text); templates that loop over content parts get `{"type": "image"}` parts ("openai"
format). Errors name the part: `messages.0.content.1.image_url`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pagedllm.multimodal.media import MediaConnector
from pagedllm.multimodal.processor import MultiModalProcessor

# Part type → (modality, the key holding its value).
_MEDIA_PARTS = {
    "image_url": ("image", "image_url"),
    "image_pil": ("image", "image_pil"),
    "video_url": ("video", "video_url"),
}
_TEXT_PARTS = ("text", "input_text")

# A template that loops over a message's content parts (vLLM detects the same by its AST).
_LOOPS_OVER_CONTENT = re.compile(
    r"for\s+\w+\s+in\s+\w+(\[['\"]content['\"]\]|\.content)"
)


def template_reads_parts(template: str | None) -> bool:
    """True when a chat template loops over content parts (the "openai" format)."""
    return bool(template) and bool(_LOOPS_OVER_CONTENT.search(template or ""))


@dataclass
class ChatMedia:
    """A conversation's media, in order, with the caller's uuids (None where not given)."""

    items: dict[str, list[Any]] = field(default_factory=dict)
    uuids: dict[str, list[str | None]] = field(default_factory=dict)

    def add(self, modality: str, item: Any, uuid: str | None) -> None:
        """One more item."""
        self.items.setdefault(modality, []).append(item)
        self.uuids.setdefault(modality, []).append(uuid)

    def prompt(self, text: str) -> str | dict[str, Any]:
        """The engine prompt of the rendered `text` (a plain string without media)."""
        if not self.items:
            return text
        prompt: dict[str, Any] = {"prompt": text, "multi_modal_data": dict(self.items)}
        if any(u is not None for uuids in self.uuids.values() for u in uuids):
            prompt["multi_modal_uuids"] = dict(self.uuids)
        return prompt


def extract_chat_media(
    messages: Sequence[Mapping[str, Any]], processor: MultiModalProcessor | None,
    connector: MediaConnector, parts_format: bool,
) -> tuple[list[dict[str, Any]], ChatMedia]:
    """Messages with media parts replaced by placeholders, and the media they held.

    Raises:
        ValueError: naming the part (`messages.I.content.J.image_url`) for a part of an
            unknown type, media for a text-only model or a modality it does not read, too
            many items, or a URL that cannot be read or decoded.
    """
    _check_counts(messages, processor)
    media = ChatMedia()
    converted = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            converted.append(dict(message) if isinstance(message, Mapping) else message)
            continue
        parts = [_part(p, f"messages.{index}.content.{j}", processor, connector, media)
                 for j, p in enumerate(content)]
        converted.append({**message, "content": _content(parts, processor, parts_format)})
    return converted, media


def _check_counts(
    messages: Sequence[Mapping[str, Any]], processor: MultiModalProcessor | None
) -> None:
    """Refuse media for a text-only model, and too many items, before reading any URL."""
    counts: dict[str, int] = {}
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in _MEDIA_PARTS:
                if processor is None:
                    raise ValueError(f"messages.{index}.content.{j}.{kind}: this model reads "
                                     "text only; it takes no images or video.")
                modality = _MEDIA_PARTS[kind][0]
                if modality not in processor.modalities:
                    raise ValueError(f"messages.{index}.content.{j}.{kind}: this model does "
                                     f"not take {modality} inputs.")
                counts[modality] = counts.get(modality, 0) + 1
    if processor is not None and counts:
        processor.check_counts(counts, where="messages")


def _part(
    part: Any, where: str, processor: MultiModalProcessor | None, connector: MediaConnector,
    media: ChatMedia,
) -> tuple[str, str]:
    """("text", its text) or (modality, its placeholder), the item added to `media`."""
    if not isinstance(part, Mapping) or "type" not in part:
        raise ValueError(f"{where} must be a content part with a 'type'.")
    kind = part["type"]
    if kind in _TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{where}.text must be a string.")
        return "text", text
    if kind not in _MEDIA_PARTS:
        raise ValueError(
            f"{where}: content part type {kind!r} is not supported (text, image_url, "
            "image_pil, video_url)."
        )
    assert processor is not None  # _check_counts refused media for a text-only model
    modality, key = _MEDIA_PARTS[kind]
    item = _load(part.get(key), kind, f"{where}.{key}", connector)
    media.add(modality, item, part.get("uuid"))
    return modality, processor.placeholder(modality)


def _load(value: Any, kind: str, where: str, connector: MediaConnector) -> Any:
    from PIL import Image

    if kind == "image_pil":
        if not isinstance(value, Image.Image):
            raise ValueError(f"{where} must be a PIL image.")
        return value
    url = value.get("url") if isinstance(value, Mapping) else value
    if not isinstance(url, str):
        raise ValueError(f"{where} must be {{'url': ...}} or a URL string.")
    try:
        return connector.load_video(url) if kind == "video_url" else connector.load_image(url)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _content(
    parts: list[tuple[str, str]], processor: MultiModalProcessor | None, parts_format: bool
) -> str | list[dict[str, str]]:
    """A message's content for the template, in the template's format (text alone: one
    string, its parts joined by newlines)."""
    if parts_format and any(kind != "text" for kind, _ in parts):
        return [{"type": "text", "text": v} if k == "text" else {"type": k} for k, v in parts]
    placeholders = [value for kind, value in parts if kind != "text"]
    texts = "\n".join(value for kind, value in parts if kind == "text")
    return "\n".join([*placeholders, texts]) if placeholders else texts
