"""Qwen2-VL and Qwen2.5-VL (windowed tower) through the engine: greedy float32 tokens
equal transformers' with 0, 1 and 3 images of different sizes per prompt in one batch
(M-RoPE positions, the text after an image continuing from its grid), chunks splitting
images, prefix caching on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pagedllm import LLM
from pagedllm.models.qwen2_vl import mrope_positions

from .tiny_vlm import (
    QWEN2VL_IMAGE,
    check_engine_matches_transformers,
    make_tiny_qwen2_vl,
    random_image,
    video_prompts,
)


@pytest.mark.parametrize(("version", "budget", "steps"),
                         [("2", 8, 1), ("2", 256, 1), ("2.5", 8, 1), ("2", 256, 4)])
def test_qwen2_vl_matches_transformers(
    version, budget, steps, tiny_tokenizer_dir, tmp_path: Path
):
    """Chunked or not; with 4 decode steps per scheduler step (M-RoPE decode positions
    in the runner's extra steps)."""
    path = make_tiny_qwen2_vl(tmp_path / "qwen2_vl", tiny_tokenizer_dir, version)
    check_engine_matches_transformers(path, QWEN2VL_IMAGE, max_model_len=256,
                                      max_num_batched_tokens=budget, num_scheduler_steps=steps)


@pytest.mark.parametrize(("version", "budget"), [("2", 16), ("2.5", 512)])
def test_video_matches_transformers(version, budget, tiny_tokenizer_dir, tmp_path: Path):
    """Videos as frames (and an image beside one), chunked or whole: transformers' tokens."""
    path = make_tiny_qwen2_vl(tmp_path / "qwen2_vl", tiny_tokenizer_dir, version)
    check_engine_matches_transformers(path, QWEN2VL_IMAGE, prompts=video_prompts(),
                                      max_model_len=512, max_num_batched_tokens=budget)


def test_mrope_positions_follow_the_grid():
    # 2 text tokens, a 1 x 4 x 6 grid merged 2 x 2 (2 x 3 tokens), 1 text token.
    positions, delta = mrope_positions(9, [(2, (1, 4, 6), 1.0)], merge=2)
    assert positions[:, :2].tolist() == [[0, 1]] * 3
    assert positions[:, 2:8].tolist() == [[2] * 6, [2, 2, 2, 3, 3, 3], [2, 3, 4, 2, 3, 4]]
    assert positions[:, 8].tolist() == [5, 5, 5]  # 2 + max(2, 3)
    assert delta == 6 - 9 and np.all(positions >= 0)


@pytest.mark.parametrize("version", ["2", "2.5"])
def test_vision_tower_equals_transformers(version, tiny_tokenizer_dir, tmp_path: Path):
    """The tower alone (2.5: windows and full blocks), two images in one pass."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    path = make_tiny_qwen2_vl(tmp_path / "qwen2_vl", tiny_tokenizer_dir, version)
    inputs = AutoImageProcessor.from_pretrained(path)(
        images=[random_image(2), random_image(3, (64, 30))], return_tensors="pt")
    theirs = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = theirs.model.visual(inputs["pixel_values"], inputs["image_grid_thw"])
    llm = LLM(str(path), dtype="float32", max_model_len=256)
    ours = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner.model
    grids = [tuple(g) for g in inputs["image_grid_thw"].tolist()]
    with torch.no_grad():
        got = ours.visual(inputs["pixel_values"], grids)
    torch.testing.assert_close(got, expected.pooler_output, rtol=1e-5, atol=1e-5)


def test_chat_video_url_equals_the_frames(tiny_tokenizer_dir, tmp_path: Path):
    """A video_url part (an animated GIF as a data: URL) gives the tokens of the same
    frames passed offline, at the GIF's frame rate; a second video over the limit is
    refused naming the part, and nothing stays held."""
    import base64
    import io

    from pagedllm import SamplingParams
    from pagedllm.multimodal.media import decode_video

    from .tiny_vlm import random_video

    path = make_tiny_qwen2_vl(tmp_path / "qwen2_vl", tiny_tokenizer_dir, "2.5")
    llm = LLM(str(path), dtype="float32", max_model_len=512,
              limit_mm_per_prompt={"image": 1, "video": 1})
    frames = random_video(9, 5)
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:],
                   duration=500, loop=0)
    url = "data:image/gif;base64," + base64.b64encode(buffer.getvalue()).decode()
    part = {"type": "video_url", "video_url": {"url": url}}
    params = SamplingParams(temperature=0.0, max_tokens=6)
    chat = llm.chat([{"role": "user", "content": [part, {"type": "text", "text": "Why?"}]}],
                    params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "<|vision_start|><|video_pad|><|vision_end|>\nWhy?"}],
        tokenize=False, add_generation_prompt=True)
    video = decode_video(base64.b64decode(url.split(",", 1)[1]))
    assert video.fps == pytest.approx(2.0)
    direct = llm.generate({"prompt": text, "multi_modal_data": {"video": video}}, params,
                          use_tqdm=False)
    assert chat[0].outputs[0].token_ids == direct[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"messages.*video"):
        llm.chat([{"role": "user", "content": [part, part]}], params, use_tqdm=False)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.kv_cache_usage == 0.0 and not scheduler.encoder.cache.users
