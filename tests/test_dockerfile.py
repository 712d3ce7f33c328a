"""The Dockerfile builds, and its container serves the default model: /health answers and a
completion comes back. Needs a Docker daemon (and the network the build's pip installs
need); without one the test is skipped, saying so."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]


def _docker_daemon() -> str | None:
    """Why Docker cannot be used here, or None when it can."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer in 30 s"
    if info.returncode != 0:
        return "no Docker daemon: " + (info.stderr.strip().splitlines() or ["?"])[-1]
    return None


@pytest.mark.slow
def test_image_builds_and_serves(tmp_path):
    reason = _docker_daemon()
    if reason is not None:
        pytest.skip(reason)
    from tests.entrypoints.openai.conftest import free_port

    tag = f"pagedllm-test:{uuid.uuid4().hex[:8]}"
    build = subprocess.run(["docker", "build", "-t", tag, str(REPO)], capture_output=True,
                           text=True, timeout=3600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    port = free_port()
    name = f"pagedllm-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", tag,
                    "--max-model-len", "2048"], check=True, capture_output=True, timeout=120)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, subprocess.run(
                ["docker", "logs", name], capture_output=True, text=True).stderr[-3000:]
            time.sleep(1)
        body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        response = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200
        assert response.json()["choices"][0]["text"]
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=300)
