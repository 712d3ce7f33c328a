"""Videos: frames cut as transformers' Qwen2-VL video processor cuts them (checked against
its image processor and its video layout), decoded from files (animated images with PIL,
mp4 with PyAV), sampled to a frame limit, and bad ones refused naming the field."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch

from pagedllm.multimodal.media import MediaConnector, MediaError, decode_video, video_num_frames
from pagedllm.multimodal.video import QwenVideoProcessor

from .tiny_vlm import random_image, random_video


@pytest.fixture(scope="module")
def image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                    min_pixels=16 * 16, max_pixels=64 * 64)


def test_two_equal_frames_are_the_image(image_processor):
    """transformers' image processor repeats an image over the temporal patch: a video of
    that frame twice must give exactly its patches and grid."""
    frame = random_image(5, (40, 52))
    image = image_processor(images=[frame], return_tensors="pt")
    video = QwenVideoProcessor(image_processor)([[frame, frame]])
    assert torch.equal(video["pixel_values_videos"], image["pixel_values"])
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist() == [[1, 12, 10]]


def test_frames_follow_the_video_processors_layout(image_processor):
    """Distinct frames, laid out as transformers' video processor does it (its patchify:
    view (batch, t, frame, C, rows/2, 2, P, cols/2, 2, P), permute (0, 1, 4, 7, 5, 8, 3, 2,
    6, 9)), the odd last frame repeated."""
    frames = random_video(7, 3, (40, 52))
    normalized = np.stack([
        image_processor(images=[f], return_tensors=None, do_resize=True)["pixel_values"]
        for f in frames
    ])  # each [h * w, C * 2 * P * P], one frame repeated: its first temporal half is it
    got = QwenVideoProcessor(image_processor)([frames])
    assert got["video_grid_thw"].tolist() == [[2, 12, 10]]
    pixels = torch.from_numpy(np.stack([_unpatchify(n) for n in normalized]))  # [3, C, H, W]
    pixels = torch.cat([pixels, pixels[-1:]])[None]  # the last frame fills the pair
    view = pixels.view(1, 2, 2, 3, 6, 2, 4, 5, 2, 4).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    expected = view.reshape(2 * 12 * 10, 3 * 2 * 4 * 4)
    torch.testing.assert_close(got["pixel_values_videos"], expected, rtol=0, atol=0)


def _unpatchify(patches: np.ndarray) -> np.ndarray:
    """The image processor's [h * w, C * 2 * P * P] patches of one image → (C, H, W)."""
    blocks = patches.reshape(6, 5, 2, 2, 3, 2, 4, 4)[:, :, :, :, :, 0]  # one temporal copy
    return blocks.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, 48, 40)


class _TorchvisionLikeProcessor:
    """Calls `patchify` as transformers' torchvision backend does (the backend where
    torchvision is installed: it cannot load in this suite): on tensor stacks of frames,
    (B, C, H, W), one stack of all the same-sized frames (`grouped`) or one per frame, each
    result cut into one entry per frame, the entries concatenated with torch.cat (or, for a
    single frame, taken as they are). The frames are given already normalised."""

    patch_size, merge_size, temporal_patch_size = 4, 2, 2

    def __init__(self, frames: list[np.ndarray], grouped: bool) -> None:
        self.frames = frames
        self.grouped = grouped

    def patchify(self, images: torch.Tensor, **kwargs: int) -> tuple[torch.Tensor, int, int]:
        raise AssertionError("QwenVideoProcessor replaces it")

    def __call__(self, images: list, return_tensors: str | None = None, **kwargs) -> dict:
        stacks = ([np.stack(self.frames)] if self.grouped
                  else [frame[None] for frame in self.frames])
        entries = []
        for stack in stacks:
            patches, _, _ = self.patchify(torch.from_numpy(stack), patch_size=4, merge_size=2,
                                          temporal_patch_size=2)
            entries += [patches[i] for i in range(len(stack))]
        pixels = entries[0] if len(entries) == 1 else torch.cat(entries, dim=0)
        return {"pixel_values": pixels}


@pytest.mark.parametrize(("num_frames", "grouped"), [(3, True), (3, False), (1, True)])
def test_frames_from_the_torchvision_backend_are_cut_the_same(image_processor, num_frames,
                                                              grouped):
    """Where torchvision is installed, transformers' Qwen2-VL image processor is its
    torchvision backend, which hands patchify tensor stacks of frames (a GPU machine's
    failure: torch.cat got the stand-in's numpy array). The video must be cut as from the
    PIL backend's frames."""
    frames = random_video(7, num_frames, (40, 52))
    normalized = [
        _unpatchify(image_processor(images=[f], return_tensors=None)["pixel_values"])
        for f in frames
    ]
    expected = QwenVideoProcessor(image_processor)([frames])
    got = QwenVideoProcessor(_TorchvisionLikeProcessor(normalized, grouped))([frames])
    assert got["video_grid_thw"].tolist() == expected["video_grid_thw"].tolist()
    torch.testing.assert_close(got["pixel_values_videos"], expected["pixel_values_videos"],
                               rtol=0, atol=0)


def test_frame_rate_sets_seconds_per_temporal_patch(image_processor):
    processor = QwenVideoProcessor(image_processor)
    frames = random_video(1, 4)
    assert processor([frames])["second_per_grid_ts"].tolist() == [pytest.approx(2 / 24)]
    assert processor([frames], fps=2.0)["second_per_grid_ts"].tolist() == [1.0]
    decoded = decode_video(_gif(frames, duration_ms=250))
    assert decoded.fps == pytest.approx(4.0)
    assert processor([decoded], fps=2.0)["second_per_grid_ts"].tolist() == [0.5]


def test_frames_of_different_sizes_are_refused(image_processor):
    with pytest.raises(ValueError, match="one size"):
        QwenVideoProcessor(image_processor)([[random_image(1), random_image(2, (30, 30))]])


def _gif(frames: list, duration_ms: int) -> bytes:
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:],
                   duration=duration_ms, loop=0)
    return buffer.getvalue()


def test_animated_gif_decodes_and_samples_frames():
    frames = random_video(3, 10)
    video = decode_video(_gif(frames, duration_ms=100), num_frames=4)
    assert len(video) == 4 and video[0].size == (40, 52) and video[0].mode == "RGB"
    assert video.fps == pytest.approx(10.0 * 4 / 10)  # the sampled frames' rate
    assert len(decode_video(_gif(frames, duration_ms=100))) == 10


def test_mp4_decodes_with_pyav():
    av = pytest.importorskip("av")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 40, 52, "yuv420p"
        for i in range(6):
            frame = av.VideoFrame.from_ndarray(np.full((52, 40, 3), 40 * i, np.uint8),
                                               format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    video = decode_video(buffer.getvalue())
    assert len(video) == 6 and video.fps == pytest.approx(4.0)
    assert np.asarray(video[5]).mean() > np.asarray(video[0]).mean() + 100  # in order


def test_bad_videos_are_media_errors():
    with pytest.raises(MediaError, match="cannot be decoded"):
        decode_video(b"no video here" * 20)
    url = "data:video/mp4;base64," + base64.b64encode(b"garbage" * 30).decode()
    with pytest.raises(MediaError, match="cannot be decoded"):
        MediaConnector().load_video(url)


def test_media_io_kwargs():
    assert video_num_frames(None) == 32
    assert video_num_frames('{"video": {"num_frames": 8}}') == 8
    for bad, match in [('{"audio": {}}', "keys"), ('{"video": {"fps": 2}}', "fps"),
                       ('{"video": {"num_frames": 0}}', "positive"), ("{bad", "JSON")]:
        with pytest.raises(ValueError, match=match):
            video_num_frames(bad)

