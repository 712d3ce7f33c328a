"""The serving benchmark's client (bench/serve_client.py) against a server that closes its
connections without saying so, as llama-server does after a few kept-alive requests."""

from __future__ import annotations

import asyncio
import json

from pagedllm.bench.serve_client import run_workload

_EVENTS = (
    "data: " + json.dumps({"choices": [{"text": "hi"}]}) + "\n\n"
    + "data: " + json.dumps({"choices": [{"text": " there"}]}) + "\n\n"
    + "data: [DONE]\n\n"
).encode()


async def _one_request_per_connection(reader: asyncio.StreamReader,
                                      writer: asyncio.StreamWriter) -> None:
    """Answer the connection's first request as HTTP/1.1 keep-alive (no Connection: close),
    then close it when a second request arrives, unanswered."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 + f"Content-Length: {len(_EVENTS)}\r\n\r\n".encode() + _EVENTS)
    await writer.drain()
    await reader.read(1)  # the next request on this connection, or its end
    writer.close()


def test_every_request_gets_its_own_connection():
    """A reused connection the server has given up on failed a quarter of llama-server's
    requests ("Can not write request body"); one connection per request, as vLLM's client
    has, loses none."""

    async def run() -> list[bool]:
        server = await asyncio.start_server(_one_request_per_connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            results, _ = await run_workload(f"http://127.0.0.1:{port}/v1/completions",
                                            [{"prompt": "x"}] * 6, max_concurrency=1)
        return [r.success and r.output_text == "hi there" for r in results]

    assert asyncio.run(run()) == [True] * 6
