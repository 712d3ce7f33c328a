"""`pagedllm chat` and `pagedllm complete` against a running server: lines from stdin go out
as a conversation / as prompts, the streamed answers come back on stdout equal to the API's
own (greedy), `--quick` sends one message; a server error exits 1 with its message."""

from __future__ import annotations

import subprocess
import sys

from .conftest import API_KEY, MODEL_NAME, REPO

CLIENT = [sys.executable, "-m", "pagedllm.entrypoints.cli"]


def _run(command: str, server, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLIENT, command, "--url", server.url_v1, "--api-key", API_KEY, "--temperature", "0",
         "--max-tokens", "6", *args],
        input=stdin, capture_output=True, text=True, timeout=300, cwd=REPO,
    )


def test_chat_keeps_the_conversation(server, client):
    done = _run("chat", server, "--system-prompt", "Be brief.", stdin="Hello\nAnd again\n")
    assert done.returncode == 0, done.stderr
    replies = done.stdout.splitlines()
    messages = [{"role": "system", "content": "Be brief."}]
    for line, reply in zip(["Hello", "And again"], replies, strict=True):
        messages.append({"role": "user", "content": line})
        want = client.chat.completions.create(model=MODEL_NAME, messages=messages,
                                              max_tokens=6, temperature=0)
        assert reply == want.choices[0].message.content
        messages.append({"role": "assistant", "content": reply})


def test_complete_and_quick(server, client):
    done = _run("complete", server, "--quick", "The paged cache")
    assert done.returncode == 0, done.stderr
    want = client.completions.create(model=MODEL_NAME, prompt="The paged cache", max_tokens=6,
                                     temperature=0)
    assert done.stdout == want.choices[0].text + "\n"


def test_server_errors_exit_1_with_the_message(server):
    done = _run("complete", server, "--model-name", "no-such-model", "--quick", "x")
    assert done.returncode == 1
    assert "404" in done.stderr and "no-such-model" in done.stderr
