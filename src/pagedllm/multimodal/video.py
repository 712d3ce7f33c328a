"""Videos as frames for Qwen2-VL and Qwen2.5-VL, without torchvision.

transformers' Qwen2-VL video processor is written on torchvision, which this project's
pinned torch cannot load, so it is rebuilt here over the checkpoint's own image processor:
every frame is resized, rescaled and normalised by the image processor exactly as an image
is (its `patchify` step is skipped), then the frames are cut into the video layout: pairs of
frames (`temporal_patch_size`) become one temporal patch, the last frame repeated to fill
the last pair, and patches ordered as transformers' video processor orders them (merge
blocks row-major inside each temporal step). A video of two equal frames gives exactly the
image's patches (tests/multimodal/test_video.py).

Frames are taken as given (no sampling): a video is a list of PIL images or (H, W, C)
arrays, or one (frames, H, W, C) array. Its frame rate (a decoded video's own `fps`
attribute, media.Video; else the `fps` processor option; else 24, transformers' default
without metadata) sets Qwen2.5-VL's temporal positions.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

# transformers' assumption for a video given without metadata.
DEFAULT_FPS = 24.0


def video_frames(video: Any) -> list[np.ndarray]:
    """A video → its frames as (H, W, C) uint8 arrays, all one size.

    Raises:
        ValueError: for frames of different sizes, or no frames.
    """
    if isinstance(video, torch.Tensor):
        video = video.numpy()
    frames = [np.asarray(frame) for frame in video]
    if not frames:
        raise ValueError("a video needs at least one frame")
    shapes = {frame.shape for frame in frames}
    if len(shapes) != 1:
        raise ValueError(f"a video's frames must all have one size, got {sorted(shapes)}")
    return frames


class QwenVideoProcessor:
    """Frames → `pixel_values_videos`, `video_grid_thw` and `second_per_grid_ts`, as
    transformers' Qwen2-VL video processor makes them.

    Args:
        image_processor: the checkpoint's Qwen2-VL image processor (PIL or torchvision
            backend).
    """

    def __init__(self, image_processor: Any) -> None:
        self.image_processor = image_processor
        self.patch_size = int(image_processor.patch_size)
        self.merge_size = int(image_processor.merge_size)
        self.temporal_patch_size = int(image_processor.temporal_patch_size)
        # The image processor with its patchify step skipped: normalised (C, H, W) frames.
        self._frames_processor = copy.copy(image_processor)
        self._frames_processor.patchify = _unpatched

    def __call__(self, videos: Sequence[Any], fps: float | None = None,
                 return_tensors: str = "pt", **kwargs: Any) -> dict[str, torch.Tensor]:
        """Every video's patches, one after another, and its grid and seconds per grid
        (torch tensors whatever `return_tensors` says: it is taken as transformers'
        processors take it)."""
        patches, grids, seconds = [], [], []
        for video in videos:
            rate = getattr(video, "fps", None) or fps or DEFAULT_FPS
            seconds.append(self.temporal_patch_size / float(rate))
            frames = video_frames(video)
            normalised = self._frames_processor(images=frames, return_tensors=None, **kwargs)
            pixels = normalised["pixel_values"]
            if isinstance(pixels, torch.Tensor):  # the torchvision backend's
                pixels = pixels.cpu().numpy()
            video_patches, grid = self.patchify(np.asarray(pixels))
            patches.append(video_patches)
            grids.append(grid)
        return {
            "pixel_values_videos": torch.from_numpy(np.concatenate(patches)),
            "video_grid_thw": torch.tensor(grids, dtype=torch.int64),
            "second_per_grid_ts": torch.tensor(seconds, dtype=torch.float32),
        }

    def patchify(self, frames: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        """(T, C, H, W) normalised frames → [t * h * w, C * T_patch * P * P] and (t, h, w)."""
        tps, patch, merge = self.temporal_patch_size, self.patch_size, self.merge_size
        if pad := -frames.shape[0] % tps:  # the last frame fills the last temporal patch
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        num_frames, channels, height, width = frames.shape
        grid_t, grid_h, grid_w = num_frames // tps, height // patch, width // patch
        patches = frames.reshape(grid_t, tps, channels, grid_h // merge, merge, patch,
                                 grid_w // merge, merge, patch)
        # (t, block row, block column, row in block, column in block, C, frame, py, px)
        patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = patches.reshape(grid_t * grid_h * grid_w, channels * tps * patch * patch)
        return np.ascontiguousarray(flat, dtype=np.float32), (grid_t, grid_h, grid_w)


def _unpatched(
    images: np.ndarray | torch.Tensor, **kwargs: Any
) -> tuple[np.ndarray | torch.Tensor, int, int]:
    """Stands in for the image processor's patchify: the frames themselves. The PIL backend
    patchifies one (C, H, W) frame: (1, C, H, W). The torchvision backend (where torchvision
    is installed) patchifies a stack of same-sized frames, (B, C, H, W), and cuts the result
    into one entry per frame: (B, 1, C, H, W). Either way the frames come out (T, C, H, W)."""
    if isinstance(images, torch.Tensor):
        return images.float().unsqueeze(1), 1, 1
    return np.asarray(images, dtype=np.float32)[None], 1, 1
