"""What a multimodal item becomes on its way to the model: plain data, no torch at import.

The frontend's processor (processor.py) turns each image or video of a prompt into a
`MultiModalFeature`: where its placeholder tokens sit in the prompt, which of them take an
embedding, the item's hash (its identity in the encoder cache and in prefix-cache keys) and
the tensors the vision encoder reads. Features travel in the request's `RequestData` to
the scheduler (which budgets the encoder) and to the model runner (which runs it).
"""

from __future__ import annotations

import msgspec

MODALITIES = ("image", "video")


class TensorData(msgspec.Struct, array_like=True, gc=False):
    """A tensor as bytes on the wire (msgpack: no pickle): dtype name, shape, raw data
    (tensor_data.py converts)."""

    dtype: str
    shape: list[int]
    data: bytes


class MultiModalFeature(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One image or video of a prompt, processed.

    Attributes:
        modality: "image" or "video".
        identifier: the item's hash (or the caller's `multi_modal_uuids` entry, made unique
            per model and processor options): its encoder output's key in the encoder
            cache, and part of the prefix-cache key of every block it overlaps.
        offset: index of its first placeholder token in the prompt.
        length: how many prompt tokens its placeholder spans.
        is_embed: per placeholder token, whether it takes one of the encoder's output rows
            (None: all of them do); separator tokens inside the span keep their text
            embedding.
        data: the encoder's inputs (pixel values, grid sizes...), by the name the model
            reads them.
        bidirectional: its embedding tokens attend to each other both ways (Gemma 3):
            they must be computed in one step.
    """

    modality: str
    identifier: str
    offset: int
    length: int
    is_embed: list[bool] | None = None
    data: dict[str, TensorData] = msgspec.field(default_factory=dict)
    bidirectional: bool = False

    @property
    def num_embeds(self) -> int:
        """Rows of encoder output the item takes (its budget and cache size)."""
        return self.length if self.is_embed is None else sum(self.is_embed)

    @property
    def end(self) -> int:
        """Index past its last placeholder token."""
        return self.offset + self.length
