"""A vision-language model behind `pagedllm serve`, driven with the openai client as a vLLM
user would: image_url parts (data:, http(s), file://), streamed and not, /tokenize counting
image tokens, and every bad image input answered 400 naming the part while the server
keeps serving and holds nothing once idle; video_url parts on a Qwen2.5-VL server."""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from ...multimodal.tiny_vlm import make_tiny_llava, make_tiny_qwen2_vl, random_image, random_video
from .conftest import API_KEY, RunningServer, free_port, metric, start_server, stop_server

MODEL = "tiny-llava"


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _data_url(image) -> str:
    return "data:image/png;base64," + base64.b64encode(_png(image)).decode()


def _gif(frames) -> bytes:
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:],
                   duration=250, loop=0)
    return buffer.getvalue()


CLIP = random_video(11, 6)  # a 6-frame animated GIF: /clip.gif


class _MediaHandler(http.server.BaseHTTPRequestHandler):
    """/cat.png, /slow.png (answers after 3 s), /big.png (over the cap), /clip.gif (a
    video), else 404."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/slow.png":
            time.sleep(3)
        if self.path in ("/cat.png", "/slow.png"):
            body = _png(random_image(5))
        elif self.path == "/big.png":
            body = b"\x89PNG" + b"0" * 300_000
        elif self.path == "/clip.gif":
            body = _gif(CLIP)
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)  # a client that timed out is gone

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def media_url() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MediaHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory, tiny_tokenizer_dir) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("vlm_server")
    path = make_tiny_llava(tmp / "llava", tiny_tokenizer_dir)
    media = tmp / "media"
    media.mkdir()
    random_image(5).save(media / "cat.png")
    running = start_server(
        [str(path), "--dtype", "float32", "--max-model-len", "256", "--api-key", API_KEY,
         "--served-model-name", MODEL, "--limit-mm-per-prompt", '{"image": 2}',
         "--allowed-local-media-path", str(media), "--allowed-media-domains", "127.0.0.1"],
        tmp / "server.log",
        env={"PAGEDLLM_IMAGE_FETCH_TIMEOUT": "1", "PAGEDLLM_MEDIA_MAX_BYTES": "200000"},
    )
    yield running, media
    stop_server(running)


@pytest.fixture(scope="module")
def client(vlm_server):
    with openai.OpenAI(base_url=vlm_server[0].url_v1, api_key=API_KEY, max_retries=0) as c:
        yield c


def _messages(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}]


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6,
                                          temperature=0.0, **kw)


def test_image_by_data_http_and_file_url_give_one_answer(client, vlm_server, media_url):
    _, media = vlm_server
    answers = [
        _chat(client, _messages(_image(url))).choices[0].message.content
        for url in (_data_url(random_image(5)), f"{media_url}/cat.png",
                    f"file://{media / 'cat.png'}")
    ]
    assert answers[0] and answers == [answers[0]] * 3
    other = _chat(client, _messages(_image(_data_url(random_image(6))))).choices[0]
    assert other.message.content != answers[0]  # the image is read
    stream = _chat(client, _messages(_image(f"{media_url}/cat.png")), stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream
                   if chunk.choices) == answers[0]


def test_tokenize_counts_the_image_tokens(vlm_server):
    server, _ = vlm_server
    headers = {"Authorization": f"Bearer {API_KEY}"}
    text_only = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}]}]
    counts = [
        httpx.post(f"{server.base_url}/tokenize", headers=headers, timeout=60,
                   json={"model": MODEL, "messages": messages}).json()["count"]
        for messages in (text_only, _messages(_image(_data_url(random_image(5)))))
    ]
    # 16 patch tokens for the image, and the newline after its placeholder.
    newline = 1
    assert counts[1] - counts[0] == 16 + newline


@pytest.mark.parametrize(("part", "match"), [
    (lambda url: _image("data:image/png;base64,aGVsbG8="), "cannot be decoded"),
    (lambda url: _image(f"{url}/slow.png"), "timed out"),
    (lambda url: _image(f"{url}/big.png"), "larger than the 200000-byte limit"),
    (lambda url: _image(f"{url}/missing.png"), "Could not fetch"),
    (lambda url: _image(f"http://127.0.0.1:{free_port()}/cat.png"), "Could not fetch"),
    (lambda url: _image(url.replace("127.0.0.1", "localhost") + "/cat.png"),
     "not in --allowed-media-domains"),
    (lambda url: _image("file:///etc/hostname"), "outside --allowed-local-media-path"),
    (lambda url: {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA=="}},
     "does not take video"),
])
def test_bad_image_inputs_answer_400_naming_the_part(client, vlm_server, media_url, part,
                                                     match):
    messages = _messages({"type": "text", "text": "Look:"}, part(media_url))
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, messages)
    body = error.value.response.json()
    assert body["error"]["code"] == 400
    assert "messages.0.content.1." in body["error"]["message"]
    assert match in body["error"]["message"]


def test_too_many_images_answer_400_and_the_server_stays_idle(client, vlm_server):
    server, _ = vlm_server
    image = _image(_data_url(random_image(5)))
    with pytest.raises(openai.BadRequestError, match=r"At most 2 image\(s\)"):
        _chat(client, _messages(image, image, image))
    assert _chat(client, _messages(image)).choices[0].message.content  # still serving
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    assert metric(text, "pagedllm:kv_cache_usage_perc") == 0.0
    assert metric(text, "pagedllm:encoder_cache_usage_perc") == 0.0
    assert metric(text, "pagedllm:num_requests_running") == 0.0


def test_text_only_model_answers_400_for_an_image(server):
    """The shared tiny Llama server (conftest): an image part is a 400, not ignored."""
    with (
        openai.OpenAI(base_url=server.url_v1, api_key=API_KEY, max_retries=0) as text_client,
        pytest.raises(openai.BadRequestError, match="reads text only") as error,
    ):
        text_client.chat.completions.create(
            model="tiny-llama", max_tokens=4,
            messages=_messages(_image(_data_url(random_image(5)))),
        )
    assert "messages.0.content.0.image_url" in error.value.response.json()["error"]["message"]


VIDEO_MODEL = "tiny-qwen2.5-vl"


@pytest.fixture(scope="module")
def video_server(tmp_path_factory, tiny_tokenizer_dir) -> Iterator[RunningServer]:
    """Qwen2.5-VL, at most one video a prompt, videos sampled to 4 frames."""
    tmp = tmp_path_factory.mktemp("video_server")
    path = make_tiny_qwen2_vl(tmp / "qwen2_5_vl", tiny_tokenizer_dir, "2.5")
    running = start_server(
        [str(path), "--dtype", "float32", "--max-model-len", "512", "--api-key", API_KEY,
         "--served-model-name", VIDEO_MODEL,
         "--limit-mm-per-prompt", '{"image": 1, "video": 1}',
         "--media-io-kwargs", '{"video": {"num_frames": 4}}',
         "--allowed-media-domains", "127.0.0.1"],
        tmp / "server.log",
    )
    yield running
    stop_server(running)


def _video(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def test_video_url_by_data_and_http_url(video_server, media_url):
    """The same GIF as a data: URL and over http gives one answer, streamed and not;
    /tokenize counts its tokens (6 frames sampled to 4: 2 temporal patches of 6 x 5
    merged patches); a video that cannot be decoded, or one too many, is a 400 naming the
    part, and the server keeps serving and holds nothing once idle."""
    with openai.OpenAI(base_url=video_server.url_v1, api_key=API_KEY, max_retries=0) as c:
        def chat(*parts, **kw):
            return c.chat.completions.create(model=VIDEO_MODEL, messages=_messages(*parts),
                                             max_tokens=6, temperature=0.0, **kw)

        data_url = "data:image/gif;base64," + base64.b64encode(_gif(CLIP)).decode()
        answer = chat(_video(data_url)).choices[0].message.content
        assert answer and chat(_video(f"{media_url}/clip.gif")).choices[0].message.content \
            == answer
        stream = chat(_video(data_url), stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream
                       if chunk.choices) == answer
        headers = {"Authorization": f"Bearer {API_KEY}"}
        text_only = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}]}]
        counts = [
            httpx.post(f"{video_server.base_url}/tokenize", headers=headers, timeout=60,
                       json={"model": VIDEO_MODEL, "messages": messages}).json()["count"]
            for messages in (text_only, _messages(_video(data_url)))
        ]
        vision_start_end, newline = 2, 1
        assert counts[1] - counts[0] == 2 * 6 * 5 + vision_start_end + newline
        for parts, match in [
            ((_video("data:video/mp4;base64," + base64.b64encode(b"x" * 64).decode()),),
             r"messages.0.content.0.video_url: .*cannot be decoded"),
            ((_video(data_url), _video(data_url)), r"At most 1 video\(s\)"),
        ]:
            with pytest.raises(openai.BadRequestError, match=match):
                chat(*parts)
        assert chat(_video(data_url)).choices[0].message.content == answer  # still serving
    text = httpx.get(f"{video_server.base_url}/metrics", timeout=30).text
    assert metric(text, "pagedllm:kv_cache_usage_perc") == 0.0
    assert metric(text, "pagedllm:encoder_cache_usage_perc") == 0.0
