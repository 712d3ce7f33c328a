"""`pagedllm run-batch`: an OpenAI batch file of 1,000 lines, 5% of them malformed, runs to
the end with every result in input order, each bad line an error record; chat, completions
and a route the model does not serve; input over http and output PUT over http."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pagedllm.entrypoints.openai.run_batch import parse_line

from .conftest import REPO

MODEL = "batch-llama"


def _good(i: int) -> dict:
    if i % 2:
        return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": MODEL, "max_tokens": 3, "temperature": 0,
                         "messages": [{"role": "user", "content": f"Say {i}"}]}}
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": f"Count to {i}", "max_tokens": 2}}


BAD_LINES = [
    "this is not json",
    json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),  # no custom_id
    json.dumps({"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {}}),
    json.dumps({"custom_id": "x", "url": "/v1/images", "body": {}}),
    json.dumps({"custom_id": "x", "url": "/v1/completions", "body": {"model": MODEL,
                                                                     "prompt": "a",
                                                                     "stream": True}}),
]


def _batch(num_lines: int) -> tuple[list[str], set[int]]:
    """Lines, and the indices of the malformed ones (5%), plus one the server answers 400."""
    lines, bad = [], set()
    for i in range(num_lines):
        if i % 20 == 7:
            lines.append(BAD_LINES[(i // 20) % len(BAD_LINES)])
            bad.add(i)
        elif i == 11:  # valid line, invalid request: the server's own 400
            lines.append(json.dumps({"custom_id": "req-11", "url": "/v1/completions",
                                     "body": {"model": MODEL, "prompt": "x",
                                              "temperature": -1}}))
            bad.add(i)
        else:
            lines.append(json.dumps(_good(i)))
    return lines, bad


def _run(tiny_llama_dir: Path, input_file: str, output_file: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    result = subprocess.run(
        [sys.executable, "-m", "pagedllm.entrypoints.cli", "run-batch", "-i", input_file,
         "-o", output_file, str(tiny_llama_dir), "--served-model-name", MODEL,
         "--max-model-len", "256", "--num-gpu-blocks-override", "512", "--max-num-seqs", "64"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_a_thousand_lines_with_malformed_ones(tiny_llama_dir, tmp_path):
    lines, bad = _batch(1000)
    assert len(bad) >= 50
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    _run(tiny_llama_dir, str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"))
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(records) == 1000
    for i, record in enumerate(records):
        if i in bad:
            assert record["error"] is not None and record["response"]["status_code"] == 400
            assert record["response"]["body"] is None
            assert record["error"]["error"]["message"]
            continue
        assert record["custom_id"] == f"req-{i}" and record["error"] is None
        body = record["response"]["body"]
        assert record["response"]["status_code"] == 200
        assert body["object"] == ("chat.completion" if i % 2 else "text_completion")
        assert body["usage"]["completion_tokens"] == (3 if i % 2 else 2) or (
            body["choices"][0]["finish_reason"] == "stop")
    assert records[11]["custom_id"] == "req-11"
    assert records[11]["error"]["error"]["param"] == "temperature"


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves GET of the batch file and takes PUT of the results."""

    store: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 - the handler's API
        data = self.store.get(self.path)
        self.send_response(200 if data is not None else 404)
        self.end_headers()
        self.wfile.write(data or b"")

    def do_PUT(self) -> None:  # noqa: N802
        length = int(self.headers["Content-Length"])
        self.store[self.path] = self.rfile.read(length)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def file_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_input_and_output_over_http(tiny_llama_dir, file_server):
    lines = [json.dumps(_good(i)) for i in range(6)]
    _Files.store["/in.jsonl"] = ("\n".join(lines) + "\n").encode()
    _run(tiny_llama_dir, f"{file_server}/in.jsonl", f"{file_server}/out.jsonl")
    records = [json.loads(line) for line in _Files.store["/out.jsonl"].decode().splitlines()]
    assert [r["custom_id"] for r in records] == [f"req-{i}" for i in range(6)]
    assert all(r["error"] is None for r in records)


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "JSON object"),
    ('{"custom_id": 5}', "custom_id"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": []}', "body"),
])
def test_malformed_lines_say_why(text, message):
    line = parse_line(text)
    assert line.error is not None and message in line.error
