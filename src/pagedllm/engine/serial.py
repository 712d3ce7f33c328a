"""msgpack encoding of the wire types in `protocol.py` (msgspec: typed, no pickle).

Frontend → core messages are two ZMQ frames: the one-byte EngineCoreRequestType, then the
payload. Core → frontend messages are one frame: an encoded EngineCoreOutputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pagedllm.engine.protocol import (
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    UtilityRequest,
)

_PAYLOAD_TYPES: dict[EngineCoreRequestType, Any] = {
    EngineCoreRequestType.ADD: EngineCoreRequest,
    EngineCoreRequestType.ABORT: list[str],
    EngineCoreRequestType.UTILITY: UtilityRequest,
}


class CoreRequestEncoder:
    """Frontend side: (type, payload) → the two frames to send."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, kind: EngineCoreRequestType, payload: Any) -> list[bytes]:
        """Frames of one message to the core."""
        return [kind.value, self._encoder.encode(payload)]


class CoreRequestDecoder:
    """Core side: the two frames → (type, typed payload)."""

    def __init__(self) -> None:
        self._decoders = {
            kind: msgspec.msgpack.Decoder(payload_type)
            for kind, payload_type in _PAYLOAD_TYPES.items()
        }

    def decode(
        self, frames: Sequence[bytes | memoryview]
    ) -> tuple[EngineCoreRequestType, Any]:
        """The message's type and payload (raises on a malformed message)."""
        kind = EngineCoreRequestType(bytes(frames[0]))
        return kind, self._decoders[kind].decode(frames[1])


class CoreOutputsEncoder:
    """Core side: EngineCoreOutputs → one frame."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, outputs: EngineCoreOutputs) -> bytes:
        """The frame to send."""
        return self._encoder.encode(outputs)


class CoreOutputsDecoder:
    """Frontend side: one frame → EngineCoreOutputs."""

    def __init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)

    def decode(self, frame: bytes) -> EngineCoreOutputs:
        """The step's outputs."""
        return self._decoder.decode(frame)
