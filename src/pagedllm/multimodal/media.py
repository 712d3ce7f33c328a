"""Images and videos from the URLs a chat message names: `data:` (base64), http(s) and
`file://`.

As vLLM's MediaConnector: http(s) downloads wait at most `fetch_timeout` seconds and read at
most `max_bytes` (PAGEDLLM_IMAGE_FETCH_TIMEOUT, PAGEDLLM_MEDIA_MAX_BYTES), only from
`allowed_media_domains` when that list is set; `file://` reads only below
`allowed_local_media_path` (off when empty). Every failure is a `MediaError` (a
ValueError) saying what went wrong, for the server's 400.

Videos: animated GIF, WebP and PNG decode with PIL; mp4, webm and the rest with PyAV
(`pip install av`, the `video` extra) where it is installed. At most `video_num_frames`
frames are kept, spread evenly over the video (vLLM's `num_frames`, default 32), and the
rate they represent travels with them (`Video.fps`: Qwen2.5-VL's temporal positions).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pagedllm import envs


class MediaError(ValueError):
    """A media URL that cannot be read or decoded."""


class Video(list):  # type: ignore[type-arg]
    """A video's frames (PIL images, RGB) and the frame rate they represent (None:
    unknown)."""

    def __init__(self, frames: list[Any], fps: float | None = None) -> None:
        super().__init__(frames)
        self.fps = fps


@dataclass
class MediaConnector:
    """Reads images from URLs within the server's limits.

    Attributes:
        allowed_local_media_path: `file://` URLs may read below this folder ("" : never).
        allowed_media_domains: http(s) hosts allowed (None: any).
        fetch_timeout: seconds for an http(s) download (None: the environment's).
        max_bytes: the largest download or file (None: the environment's).
        video_num_frames: the most frames kept of a video.
    """

    allowed_local_media_path: str = ""
    allowed_media_domains: list[str] | None = None
    fetch_timeout: float | None = None
    max_bytes: int | None = None
    video_num_frames: int = 32

    def load_image(self, url: str) -> Any:
        """The image at `url`, decoded (PIL, RGB).

        Raises:
            MediaError: for an unsupported or disallowed URL, a failed or slow or oversized
                download, or bytes that are no image.
        """
        return decode_image(self.read(url))

    def load_video(self, url: str) -> Video:
        """The video at `url`, decoded and sampled to at most `video_num_frames` frames.

        Raises:
            MediaError: as `load_image`, or for bytes that are no video.
        """
        return decode_video(self.read(url), self.video_num_frames)

    def read(self, url: str) -> bytes:
        """The bytes `url` names, within the limits."""
        if not isinstance(url, str) or not url:
            raise MediaError("The URL must be a non-empty string.")
        scheme = urllib.parse.urlparse(url).scheme.lower()
        if scheme == "data":
            return _data_url_bytes(url)
        if scheme in ("http", "https"):
            return self._download(url)
        if scheme == "file":
            return self._read_file(url)
        raise MediaError(
            f"Unsupported URL scheme {scheme!r}: use data:, http(s):// or file:// "
            "(with --allowed-local-media-path)."
        )

    def _limit(self) -> int:
        return self.max_bytes if self.max_bytes is not None else envs.media_max_bytes()

    def _download(self, url: str) -> bytes:
        host = (urllib.parse.urlparse(url).hostname or "").lower()
        domains = self.allowed_media_domains
        if domains is not None and host not in {d.lower() for d in domains}:
            raise MediaError(f"The domain {host!r} is not in --allowed-media-domains.")
        timeout = self.fetch_timeout if self.fetch_timeout is not None else (
            envs.image_fetch_timeout()
        )
        limit = self._limit()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
                data = response.read(limit + 1)
        except TimeoutError:
            raise MediaError(f"Fetching {url} timed out after {timeout} s.") from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, TimeoutError):
                raise MediaError(f"Fetching {url} timed out after {timeout} s.") from None
            raise MediaError(f"Could not fetch {url}: {reason}") from None
        if len(data) > limit:
            raise MediaError(f"{url} is larger than the {limit}-byte limit.")
        return data

    def _read_file(self, url: str) -> bytes:
        if not self.allowed_local_media_path:
            raise MediaError(
                "file:// URLs are refused: the server was not started with "
                "--allowed-local-media-path."
            )
        root = Path(self.allowed_local_media_path).resolve()
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).resolve()
        if not path.is_relative_to(root):
            raise MediaError(f"{path} is outside --allowed-local-media-path ({root}).")
        if not path.is_file():
            raise MediaError(f"{path} is not a file.")
        if path.stat().st_size > self._limit():
            raise MediaError(f"{path} is larger than the {self._limit()}-byte limit.")
        return path.read_bytes()


def video_num_frames(media_io_kwargs: Any) -> int:
    """The frame limit of vLLM's `media_io_kwargs` (`{"video": {"num_frames": N}}`, a dict
    or its JSON text; 32 when not given).

    Raises:
        ValueError: naming an unknown key or a bad value.
    """
    options = media_io_kwargs
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError as error:
            raise ValueError(f"media_io_kwargs is not valid JSON: {error}") from None
    options = options or {}
    if not isinstance(options, dict) or any(k not in ("image", "video") for k in options):
        raise ValueError('media_io_kwargs must look like {"video": {"num_frames": 32}} '
                         f"(keys: image, video), got {options!r}.")
    if options.get("image"):
        raise ValueError(f"media_io_kwargs.image: no image options are built, got "
                         f"{options['image']!r}.")
    video = options.get("video") or {}
    unknown = sorted(set(video) - {"num_frames"}) if isinstance(video, dict) else ["video"]
    if unknown:
        raise ValueError(f"media_io_kwargs.video: unknown option(s) {unknown} (known: "
                         "num_frames).")
    frames = video.get("num_frames", 32)
    if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1:
        raise ValueError(f"media_io_kwargs.video.num_frames must be a positive integer, got "
                         f"{frames!r}.")
    return frames


def _data_url_bytes(url: str) -> bytes:
    """The payload of `data:[<type>][;base64],<data>`."""
    header, sep, payload = url.partition(",")
    if not sep:
        raise MediaError("A data: URL needs a ',' before its payload.")
    if not header.endswith(";base64"):
        return urllib.parse.unquote_to_bytes(payload)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("The data: URL's payload is not valid base64.") from None


def decode_image(data: bytes) -> Any:
    """Image file bytes → a PIL image in RGB.

    Raises:
        MediaError: when the bytes are no image PIL reads.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        raise MediaError("The image cannot be decoded (not an image file PIL reads).") from None
    return image.convert("RGB")


def decode_video(data: bytes, num_frames: int = 32) -> Video:
    """Video file bytes → at most `num_frames` frames, spread evenly, and their rate.

    Raises:
        MediaError: when neither PIL (animated images) nor PyAV reads a video in the bytes.
    """
    frames, fps = _animated_image_frames(data)
    if frames is None:
        frames, fps = _pyav_frames(data)
    if not frames:
        raise MediaError("The video has no frames.")
    total = len(frames)
    if total > num_frames:  # vLLM's uniform sampling
        indices = np.linspace(0, total - 1, num_frames, dtype=int)
        frames = [frames[i] for i in indices]
        fps = None if fps is None else fps * num_frames / total
    return Video(frames, fps)


def _animated_image_frames(data: bytes) -> tuple[list[Any] | None, float | None]:
    """An animated GIF / WebP / PNG's frames and rate; (None, None) when PIL reads no
    animation (a video container, or a still image)."""
    from PIL import Image, ImageSequence, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        if getattr(image, "n_frames", 1) < 2:
            return None, None
        frames, durations = [], []
        for frame in ImageSequence.Iterator(image):
            frames.append(frame.convert("RGB"))
            durations.append(frame.info.get("duration") or 0)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None, None
    mean_ms = sum(durations) / len(durations)
    return frames, (1000.0 / mean_ms if mean_ms > 0 else None)


def _pyav_frames(data: bytes) -> tuple[list[Any], float | None]:
    """A video file's frames and rate, decoded by PyAV (FFmpeg)."""
    try:
        import av
    except ImportError:
        raise MediaError(
            "The video cannot be decoded: it is no animated image, and other video formats "
            "need PyAV (pip install av, or pagedllm[video])."
        ) from None
    frames: list[Any] = []
    rate = None
    try:
        with av.open(io.BytesIO(data)) as container:
            for stream in container.streams.video[:1]:
                frames = [frame.to_image() for frame in container.decode(stream)]
                rate = stream.average_rate
    except (av.FFmpegError, ValueError, OSError):
        raise MediaError("The video cannot be decoded (no video file FFmpeg reads).") from None
    return frames, (float(rate) if rate else None)
