"""`pagedllm chat` and `pagedllm complete`: interactive clients of a running server (vLLM's
`vllm chat` / `vllm complete`), on the standard library only.

Each line read from stdin is sent to the server (`/v1/chat/completions` with the whole
conversation so far, or `/v1/completions` with the line as the prompt) and the answer is
streamed to stdout as it arrives. `--quick MESSAGE` sends one message and exits. The model
defaults to the first one `/v1/models` lists; the API key to $OPENAI_API_KEY or
$PAGEDLLM_API_KEY.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

COMMANDS = ("chat", "complete")
_TIMEOUT_S = 600.0


def add_client_parsers(subparsers: Any) -> None:
    """The `chat` and `complete` subcommands."""
    for name, help_text in (
        ("chat", "Chat with a running server, one message a line (streams the replies)."),
        ("complete", "Complete prompts with a running server, one prompt a line."),
    ):
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--url", default="http://localhost:8000/v1",
                            help="The server's OpenAI API base URL.")
        parser.add_argument("--model-name", default=None,
                            help="The model to ask (default: the first /v1/models lists).")
        parser.add_argument("--api-key", default=None, help="The server's API key (default: "
                            "$OPENAI_API_KEY or $PAGEDLLM_API_KEY).")
        parser.add_argument("--max-tokens", type=int, default=None)
        parser.add_argument("--temperature", type=float, default=None)
        parser.add_argument("-q", "--quick", default=None, metavar="MESSAGE",
                            help="Send this one message, print the answer and exit.")
        if name == "chat":
            parser.add_argument("--system-prompt", default=None)


class ServerClient:
    """Requests to one server's OpenAI API (JSON in, JSON or SSE out)."""

    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _open(self, path: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=self.headers)
        return urllib.request.urlopen(request, timeout=_TIMEOUT_S)

    def first_model(self) -> str:
        """The first model the server lists."""
        with self._open("/models", None) as response:
            return str(json.load(response)["data"][0]["id"])

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The JSON chunks of a streamed response."""
        with self._open(path, {**body, "stream": True}) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"].get("message", str(chunk["error"])))
                yield chunk


def _lines(quick: str | None) -> Iterator[str]:
    """The messages to send: `quick` alone, or stdin's lines (a "> " prompt on a terminal)."""
    if quick is not None:
        yield quick
        return
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            return
        if line.strip():
            yield line


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {key: value for key, value in (("max_tokens", args.max_tokens),
                                          ("temperature", args.temperature))
            if value is not None}


def _chat(client: ServerClient, model: str, args: argparse.Namespace) -> None:
    messages: list[dict[str, str]] = []
    if args.system_prompt:
        messages.append({"role": "system", "content": args.system_prompt})
    for line in _lines(args.quick):
        messages.append({"role": "user", "content": line})
        reply = ""
        for chunk in client.stream("/chat/completions",
                                   {"model": model, "messages": messages, **_sampling(args)}):
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content") or ""
                reply += piece
                print(piece, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": reply})


def _complete(client: ServerClient, model: str, args: argparse.Namespace) -> None:
    for line in _lines(args.quick):
        for chunk in client.stream("/completions",
                                   {"model": model, "prompt": line, **_sampling(args)}):
            for choice in chunk.get("choices", []):
                print(choice.get("text") or "", end="", flush=True)
        print()


def run_client(args: argparse.Namespace) -> int:
    """Run `chat` or `complete`; the exit status (1 when the server answers an error)."""
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or os.environ.get(
        "PAGEDLLM_API_KEY")
    client = ServerClient(args.url, api_key)
    try:
        model = args.model_name or client.first_model()
        (_chat if args.command == "chat" else _complete)(client, model, args)
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):  # not an OpenAI error
            detail = json.loads(detail)["error"]["message"]
        print(f"pagedllm {args.command}: error: {error.code} {detail}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, RuntimeError) as error:
        print(f"pagedllm {args.command}: error: {error}", file=sys.stderr)
        return 1
    return 0
