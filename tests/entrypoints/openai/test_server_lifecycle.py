"""The server's engine core process: faults end the server with an error, never a hang;
shutdown leaves no process behind; --no-multiprocessing keeps the core in the server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.entrypoints.openai.conftest import REPO, start_server, stop_server

ARGS = ["--max-model-len", "1024", "--num-gpu-blocks-override", "256", "--served-model-name",
        "tiny"]


def _core_pids(server_pid: int) -> list[int]:
    """Children of the server that are spawned multiprocessing workers (the engine core)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == server_pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            pids.append(int(entry))
    return pids


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _stream(base_url: str, events: list[str]) -> None:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 900, "stream": True,
            "ignore_eos": True, "temperature": 0}
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                events.append(line)
    except httpx.HTTPError as error:
        events.append(f"transport error: {error!r}")


def test_killed_core_fails_requests_and_the_server_exits(tiny_llama_dir: Path, tmp_path: Path):
    server = start_server([str(tiny_llama_dir), *ARGS], tmp_path / "server.log")
    try:
        (core_pid,) = _core_pids(server.process.pid)
        events: list[str] = []
        reader = threading.Thread(target=_stream, args=(server.base_url, events))
        reader.start()
        deadline = time.monotonic() + 10
        while len(events) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(events) >= 3, events
        os.kill(core_pid, signal.SIGKILL)
        reader.join(5)
        assert not reader.is_alive(), "the open stream hangs"
        assert any("error" in event for event in events), events[-6:]
        statuses = []
        for path in ("/health", "/v1/models"):
            with contextlib.suppress(httpx.HTTPError):  # the server may have stopped already
                statuses.append(httpx.get(server.base_url + path, timeout=2).status_code)
        assert statuses[:1] in ([], [503]), statuses
        assert server.process.wait(timeout=20) != 0
        assert "engine core" in server.log()
    finally:
        if server.process.poll() is None:
            stop_server(server)


def test_sigterm_stops_the_core_process(tiny_llama_dir: Path, tmp_path: Path):
    server = start_server([str(tiny_llama_dir), *ARGS], tmp_path / "server.log")
    core_pids = _core_pids(server.process.pid)
    assert len(core_pids) == 1
    stop_server(server)
    # uvicorn re-raises the SIGTERM it handled once it shut down cleanly.
    assert server.process.returncode in (0, -signal.SIGTERM), server.log()
    assert _gone(core_pids[0])


def test_no_multiprocessing_serves_in_one_process(tiny_llama_dir: Path, tmp_path: Path):
    server = start_server([str(tiny_llama_dir), *ARGS, "--no-multiprocessing"],
                          tmp_path / "server.log")
    try:
        assert _core_pids(server.process.pid) == []
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
        response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200
    finally:
        stop_server(server)


def test_core_startup_error_exits_with_the_message(tiny_llama_dir: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    # 4 blocks cannot hold one 1024-token request: the core process refuses to start.
    result = subprocess.run(
        [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", str(tiny_llama_dir),
         "--max-model-len", "1024", "--num-gpu-blocks-override", "4", "--port", "0"],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert result.returncode != 0
    assert "engine core failed to start" in result.stderr and "max_model_len" in result.stderr


def test_bad_model_path_exits_with_the_message(tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    result = subprocess.run(
        [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", str(tmp_path / "missing"),
         "--port", "0"], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert result.returncode != 0
    assert "missing" in result.stderr
