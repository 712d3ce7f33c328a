"""SIGTERM drains the server: a stream running when the signal comes finishes whole, new
requests meanwhile get 503 with an OpenAI error body (/health still answers), then the
server exits 0; with a short --shutdown-timeout a long stream is cut and the server still
exits."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from .conftest import API_KEY, MODEL_NAME, start_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _stream(base_url: str, max_tokens: int, chunks: list, started: threading.Event) -> None:
    body = {"model": MODEL_NAME, "prompt": "Drain me", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, headers=HEADERS,
                          timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
                    started.set()
    except httpx.HTTPError:
        pass  # cut when the timeout stops the server
    started.set()


def _serve(tiny_llama_dir, tmp_path, timeout: str):
    return start_server(
        [str(tiny_llama_dir), "--served-model-name", MODEL_NAME, "--api-key", API_KEY,
         "--max-model-len", "1024", "--max-num-seqs", "1", "--shutdown-timeout", timeout],
        tmp_path / "server.log")


def _start_streams(server, count: int) -> list[tuple[list, threading.Event, threading.Thread]]:
    """`count` streams of 1000 tokens; one runs at a time (--max-num-seqs 1), so the last
    ends seconds from now. Returns once the first chunk of any of them arrived (the others
    have been sent: they wait in the engine's queue)."""
    first_chunk = threading.Event()
    streams = []
    for _ in range(count):
        chunks: list = []
        thread = threading.Thread(target=_stream,
                                  args=(server.base_url, 1000, chunks, first_chunk))
        thread.start()
        streams.append((chunks, first_chunk, thread))
    assert first_chunk.wait(60)
    time.sleep(0.2)  # every request reached the server
    return streams


def test_sigterm_lets_running_streams_finish(tiny_llama_dir, tmp_path):
    server = _serve(tiny_llama_dir, tmp_path, "120")
    streams = _start_streams(server, 4)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = httpx.post(f"{server.base_url}/v1/completions", headers=HEADERS, timeout=30,
                         json={"model": MODEL_NAME, "prompt": "late", "max_tokens": 2})
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "ServiceUnavailableError"
    assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200
    for chunks, _, thread in streams:  # all four, queued ones included, run to the end
        thread.join(120)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(bool(c["choices"]) and bool(c["choices"][0]["text"]) for c in chunks) > 0
    assert server.process.wait(timeout=60) == 0


def test_shutdown_timeout_cuts_what_is_left(tiny_llama_dir, tmp_path):
    server = _serve(tiny_llama_dir, tmp_path, "1")
    streams = _start_streams(server, 8)  # ~8000 tokens one after the other: seconds
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0
    # A bound that only tells "stopped" from "hung" (the cut itself is checked below).
    assert time.monotonic() - signalled < 30
    for _, _, thread in streams:
        thread.join(60)
    last = [chunks[-1]["choices"][0].get("finish_reason") if chunks else None
            for chunks, _, _ in streams]
    assert last.count("length") < len(streams), last  # what was left was cut
