"""The live dashboard: /dashboard/state's numbers under traffic, and the page itself in
headless Chromium (Debian's `chromium`, driven by playwright): it loads, updates while
requests run (counts, tokens/s, KV block map, request progress), shows the TTFT and
inter-token latency histograms after them, and a screenshot is taken.

Set PAGEDLLM_SCREENSHOT_DIR to keep the screenshot (it goes to the test's tmp dir otherwise).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import MODEL_NAME, RunningServer, start_server, stop_server

NUM_BLOCKS = 256  # block 0 is the null block: 255 usable


@pytest.fixture(scope="module")
def dash_server(tiny_llama_dir, tmp_path_factory) -> Iterator[RunningServer]:
    server = start_server(
        [str(tiny_llama_dir), "--served-model-name", MODEL_NAME, "--max-model-len", "512",
         "--max-num-seqs", "4", "--num-gpu-blocks-override", str(NUM_BLOCKS)],
        tmp_path_factory.mktemp("dashboard") / "server.log")
    yield server
    stop_server(server)


def _traffic(server: RunningServer, count: int, max_tokens: int) -> list[threading.Thread]:
    """`count` streamed completions in background threads (4 run at a time, the rest wait)."""
    def one(i: int) -> None:
        body = {"model": MODEL_NAME, "prompt": f"Dashboard traffic {i} " * 8,
                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server.url_v1}/completions", json=body,
                          timeout=300) as response:
            for _ in response.iter_lines():
                pass

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def _wait_for(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _state(server: RunningServer) -> dict:
    response = httpx.get(f"{server.base_url}/dashboard/state", timeout=30)
    assert response.status_code == 200
    return response.json()


def test_state_under_traffic(dash_server):
    idle = _state(dash_server)
    assert idle["model"] == MODEL_NAME and idle["block_size"] == 16
    assert len(idle["blocks"]) == NUM_BLOCKS - 1 and set(idle["blocks"]) <= set("ucf")
    threads = _traffic(dash_server, 6, 200)
    seen: list[dict] = []

    def busy() -> bool:
        state = _state(dash_server)
        seen.append(state)
        return state["num_running"] == 4 and state["num_waiting"] >= 1

    _wait_for(busy)
    state = seen[-1]
    assert state["blocks"].count("u") > 0
    running = [r for r in state["requests"] if r["state"] == "running"]
    assert len(running) == 4 and all(r["max_tokens"] == 200 for r in running)
    assert {r["state"] for r in state["requests"]} == {"running", "waiting"}
    for thread in threads:
        thread.join(timeout=300)
    done = _state(dash_server)
    assert done["num_running"] == done["num_waiting"] == 0 and done["requests"] == []
    assert "u" not in done["blocks"] and "c" in done["blocks"]  # all free, prefixes cached
    metrics = done["metrics"]
    assert metrics["generation_tokens_total"] >= 6 * 200
    assert metrics["ttft"]["count"] >= 6 and sum(metrics["ttft"]["counts"]) >= 6
    assert metrics["itl"]["count"] >= 6 * 199
    assert metrics["ttft"]["bounds"][-1] is None  # the +Inf bucket


def _chromium() -> str | None:
    for path in ("/usr/lib/chromium/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if path and os.path.exists(path):
            return path
    return None


def test_page_in_headless_chromium(dash_server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = _chromium()
    if executable is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    shot_dir = Path(os.environ.get("PAGEDLLM_SCREENSHOT_DIR", tmp_path))
    shot_dir.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True,
                                             args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{dash_server.base_url}/dashboard?interval=200")
            page.wait_for_function("Number(document.body.dataset.updates) >= 2")
            assert page.text_content("#model") == MODEL_NAME
            assert page.get_attribute("#block-map", "data-blocks") == str(NUM_BLOCKS - 1)

            threads = _traffic(dash_server, 6, 300)
            # It updates under traffic: requests listed with progress, blocks used, tokens/s.
            page.wait_for_function(
                "Number(document.getElementById('running').textContent) > 0"
                " && document.querySelectorAll('#requests tr[data-request-id]').length > 0"
                " && Number(document.getElementById('kv-used').textContent) > 0"
                " && Number(document.getElementById('tokens-per-second').textContent) > 0",
                timeout=120_000)
            assert "live" in page.get_attribute("#status", "class")
            busy_shot = shot_dir / "dashboard.png"
            page.screenshot(path=str(busy_shot), full_page=True)
            for thread in threads:
                thread.join(timeout=300)
            page.wait_for_function(
                "Number(document.getElementById('running').textContent) === 0"
                " && Number(document.getElementById('kv-used').textContent) === 0"
                " && Number(document.getElementById('ttft-count').textContent) >= 6",
                timeout=120_000)
            assert int(page.text_content("#itl-count")) >= 6 * 299
            assert page.text_content("#requests").strip() == "no requests"
            page.screenshot(path=str(shot_dir / "dashboard_idle.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
    assert busy_shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and busy_shot.stat().st_size > 10_000
