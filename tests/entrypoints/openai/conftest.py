"""A real `pagedllm serve` subprocess on a free loopback port, driven over HTTP.

The server runs the tiny random Llama with an API key and a YAML config file (so the CLI's
config path is exercised too). Clients: the official `openai` package and httpx.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
API_KEY = "test-key-123"
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 1024
_STARTUP_TIMEOUT_S = 180.0


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    """A server subprocess and how to reach it."""

    process: subprocess.Popen
    base_url: str
    log_path: Path

    @property
    def url_v1(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(args: list[str], log_path: Path, env: dict[str, str] | None = None
                 ) -> RunningServer:
    """Start `pagedllm serve ARGS` and wait until /health answers 200."""
    port = free_port()
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), str(REPO), full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", *args,
             "--host", "127.0.0.1", "--port", str(port), "--uvicorn-log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO,
        )
    server = RunningServer(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"The server exited ({process.returncode}):\n{server.log()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    stop_server(server)
    raise RuntimeError(f"The server did not start in {_STARTUP_TIMEOUT_S}s:\n{server.log()}")


def stop_server(server: RunningServer) -> None:
    """SIGTERM, then SIGKILL if it lingers."""
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=15)


@pytest.fixture(scope="session")
def server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    """The tiny model behind `pagedllm serve`, with an API key and a YAML config."""
    tmp = tmp_path_factory.mktemp("server")
    config = tmp / "config.yaml"
    config.write_text(
        f"max-model-len: {MAX_MODEL_LEN}\n"
        "num-gpu-blocks-override: 2048\n"
        "max-num-seqs: 64\n"
        f"served-model-name: [{MODEL_NAME}, tiny-alias]\n"
        "block-size: 4\n"  # the flag below wins over this
    )
    running = start_server(
        [str(tiny_llama_dir), "--config", str(config), "--api-key", API_KEY,
         "--block-size", "16"], tmp / "server.log")
    yield running
    stop_server(running)


def openai_client(server: RunningServer):
    """The official OpenAI client pointed at `server` (close it, or use it in `with`)."""
    import openai

    return openai.OpenAI(base_url=server.url_v1, api_key=API_KEY, max_retries=0)


def http_client(server: RunningServer) -> httpx.Client:
    """httpx pointed at `server`, with the API key (close it, or use it in `with`)."""
    return httpx.Client(base_url=server.base_url, timeout=60.0,
                        headers={"Authorization": f"Bearer {API_KEY}"})


@pytest.fixture(scope="session")
def client(server: RunningServer):
    """The official OpenAI client, pointed at the server."""
    with openai_client(server) as c:
        yield c


@pytest.fixture(scope="session")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    """httpx with the API key."""
    with http_client(server) as c:
        yield c


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (summed over label sets matching `labels`)."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not match or match.group(1) != name:
            continue
        label_text = match.group(2) or ""
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(match.group(3))
            found = True
    if not found:
        raise KeyError(f"metric {name} {labels} not found")
    return total
