"""Images through the offline API as vLLM takes them: `multi_modal_data`,
`multi_modal_uuids`, `mm_processor_kwargs`, `LLM.chat` image parts (PIL, data: and file://
URLs), and every bad input refused with a ValueError naming the field, nothing leaked."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams

from .tiny_vlm import make_tiny_llava, random_image

PARAMS = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    return make_tiny_llava(tmp_path_factory.mktemp("llava"), tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("media")
    random_image(7).save(folder / "cat.png")
    (folder / "broken.png").write_bytes(b"not an image")
    return folder


@pytest.fixture(scope="module")
def llm(llava_dir, media_dir) -> LLM:
    return LLM(str(llava_dir), dtype="float32", max_model_len=128,
               limit_mm_per_prompt={"image": 2}, allowed_local_media_path=str(media_dir))


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def _data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _assert_idle(llm: LLM) -> None:
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_usage == 0.0
    assert not scheduler.encoder.cache.users


def test_chat_image_parts_equal_the_generate_prompt(llm, media_dir):
    image = random_image(7)
    expected = _tokens(llm.generate(
        {"prompt": llm.get_tokenizer().apply_chat_template(
            [{"role": "user", "content": "<image>\nWhat is this?"}], tokenize=False,
            add_generation_prompt=True),
         "multi_modal_data": {"image": image}}, PARAMS, use_tqdm=False))
    for part in (
        {"type": "image_pil", "image_pil": image},
        {"type": "image_url", "image_url": {"url": _data_url(image)}},
        {"type": "image_url", "image_url": {"url": f"file://{media_dir / 'cat.png'}"}},
    ):
        messages = [{"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}]
        assert _tokens(llm.chat(messages, PARAMS, use_tqdm=False)) == expected
    _assert_idle(llm)


def test_uuids_name_the_item_and_kwargs_reach_the_processor(llm):
    processor = llm.llm_engine.input_processor
    prompt = {"prompt": "a <image>", "multi_modal_data": {"image": random_image(1)},
              "multi_modal_uuids": {"image": ["photo-1"]}}
    assert processor.tokenize(prompt).mm_features[0].identifier == "image:photo-1"
    image_prompt = {"prompt": "a <image>", "multi_modal_data": {"image": random_image(1)}}
    plain = processor.tokenize(image_prompt)
    resized = processor.tokenize({**image_prompt, "mm_processor_kwargs": {"do_normalize": False}})
    # Other processing, other pixels: another item.
    assert plain.mm_features[0].identifier != resized.mm_features[0].identifier


@pytest.mark.parametrize(("prompt", "match"), [
    ({"prompt": "a <image>", "multi_modal_data": {"image": "cat.png"}},
     r"multi_modal_data.image\[0\] must be a PIL image"),
    ({"prompt": "<image> <image> <image>", "multi_modal_data": {"image": [random_image(1)] * 3}},
     r"At most 2 image\(s\)"),
    ({"prompt": "no placeholder", "multi_modal_data": {"image": random_image(1)}},
     "0 '<image>' placeholder"),
    ({"prompt": "a <image>", "multi_modal_data": {"audio": b"x"}}, "multi_modal_data.audio"),
    ({"prompt": "a <video>", "multi_modal_data": {"video": [random_image(1)]}},
     "does not take video"),
    ({"prompt": "a <image>", "multi_modal_data": {"image": random_image(1)},
      "multi_modal_uuids": {"image": ["a", "b"]}}, "multi_modal_uuids.image"),
])
def test_bad_multi_modal_data_is_refused(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([{"prompt": "fine <image>", "multi_modal_data": {"image": random_image(2)}},
                      prompt], PARAMS, use_tqdm=False)
    _assert_idle(llm)  # the good prompt before it was taken back


@pytest.mark.parametrize(("part", "match"), [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!"}},
     r"messages.0.content.0.image_url: .*not valid base64"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
     r"messages.0.content.0.image_url: The image cannot be decoded"),
    ({"type": "image_url", "image_url": {"url": "file:///etc/hostname"}},
     r"messages.0.content.0.image_url: .*outside --allowed-local-media-path"),
    ({"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}},
     r"messages.0.content.0.image_url: Unsupported URL scheme"),
    ({"type": "input_audio", "input_audio": {}}, "messages.0.content.0: content part type"),
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA=="}},
     r"messages.0.content.0.video_url: this model does not take video"),
])
def test_bad_chat_parts_are_refused_naming_the_part(llm, part, match):
    with pytest.raises(ValueError, match=match):
        llm.chat([{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}], PARAMS,
                 use_tqdm=False)
    _assert_idle(llm)


def test_broken_file_and_too_many_chat_images(llm, media_dir):
    broken = {"type": "image_url", "image_url": {"url": f"file://{media_dir / 'broken.png'}"}}
    with pytest.raises(ValueError, match="messages.0.content.0.image_url: The image cannot"):
        llm.chat([{"role": "user", "content": [broken]}], PARAMS, use_tqdm=False)
    image = {"type": "image_pil", "image_pil": random_image(3)}
    with pytest.raises(ValueError, match=r"At most 2 image\(s\)"):
        llm.chat([{"role": "user", "content": [image, image, image]}], PARAMS, use_tqdm=False)


def test_text_only_model_refuses_images(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64)
    with pytest.raises(ValueError, match="reads text only"):
        llm.generate({"prompt": "a", "multi_modal_data": {"image": random_image(1)}}, PARAMS)
    part = {"type": "image_pil", "image_pil": random_image(1)}
    with pytest.raises(ValueError, match=r"messages.0.content.0.image_pil: this model reads"):
        llm.chat([{"role": "user", "content": [part]}], PARAMS)
    with pytest.raises(ValueError, match="takes no images"):
        LLM(str(tiny_llama_dir), dtype="float32", limit_mm_per_prompt={"image": 1})
