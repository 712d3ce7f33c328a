"""Images from the URLs a chat message names: `data:` (base64), http(s) and `file://`.

As vLLM's MediaConnector: http(s) downloads wait at most `fetch_timeout` seconds and read at
most `max_bytes` (PAGEDLLM_IMAGE_FETCH_TIMEOUT, PAGEDLLM_MEDIA_MAX_BYTES), only from
`allowed_media_domains` when that list is set; `file://` reads only below
`allowed_local_media_path` (off when empty). Every failure is a `MediaError` (a
ValueError) saying what went wrong, for the server's 400.
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedllm import envs


class MediaError(ValueError):
    """An image URL that cannot be read or decoded."""


@dataclass
class MediaConnector:
    """Reads images from URLs within the server's limits.

    Attributes:
        allowed_local_media_path: `file://` URLs may read below this folder ("" : never).
        allowed_media_domains: http(s) hosts allowed (None: any).
        fetch_timeout: seconds for an http(s) download (None: the environment's).
        max_bytes: the largest download or file (None: the environment's).
    """

    allowed_local_media_path: str = ""
    allowed_media_domains: list[str] | None = None
    fetch_timeout: float | None = None
    max_bytes: int | None = None

    def load_image(self, url: str) -> Any:
        """The image at `url`, decoded (PIL, RGB).

        Raises:
            MediaError: for an unsupported or disallowed URL, a failed or slow or oversized
                download, or bytes that are no image.
        """
        return decode_image(self.read(url))

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
