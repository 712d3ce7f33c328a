"""`pagedllm disagg-proxy`: one OpenAI-compatible address in front of prefill and decode
instances (vLLM's disaggregated-prefill proxy).

Each completion or chat request goes first to a prefill instance with one output token,
no stream and `kv_transfer_params: {"do_remote_decode": true}` (its KV connector keeps the
prompt's blocks for the decode side), then, with the `kv_transfer_params` that answer
carries, to a decode instance, whose answer (streamed or not) is passed back unchanged. Of
several instances of a kind, the one with the fewest requests in flight is chosen. A client
that leaves closes both upstream requests, so both instances abort theirs. `/v1/models`
answers from a decode instance; `/health` is 200 while every instance answers its own.

    pagedllm disagg-proxy --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
    python -m pagedllm.entrypoints.disagg_proxy --prefill URL --decode URL --port 8000
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedllm.entrypoints.openai.errors import error_body
from pagedllm.entrypoints.openai.serving_engine import cancel_on_disconnect

_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)


@dataclass
class Upstreams:
    """The instances of one kind and their requests in flight."""

    urls: list[str]
    in_flight: dict[str, int] = field(default_factory=dict)

    def pick(self) -> str:
        """The least loaded (the first of equals)."""
        return min(self.urls, key=lambda url: self.in_flight.get(url, 0))

    @contextlib.contextmanager
    def using(self, url: str) -> Any:
        """Count a request on `url` while it lasts."""
        self.in_flight[url] = self.in_flight.get(url, 0) + 1
        try:
            yield url
        finally:
            self.in_flight[url] -= 1


def _prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the prefill instance gets it: one token, no stream."""
    prefill = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    prefill.update(max_tokens=1, stream=False,
                   kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    prefill.pop("n", None)
    prefill.pop("min_tokens", None)  # one token: a larger minimum would be refused
    return prefill


def build_app(prefill: Sequence[str], decode: Sequence[str],
              client: httpx.AsyncClient | None = None) -> FastAPI:
    """The proxy over these instances (`client`: the HTTP client to reach them)."""
    prefills, decodes = Upstreams(list(prefill)), Upstreams(list(decode))
    http = client or httpx.AsyncClient(timeout=_TIMEOUT)
    app = FastAPI(title="pagedllm disaggregated-prefill proxy")

    async def forward(path: str, raw: Request) -> Response:
        headers = {k: v for k, v in raw.headers.items()
                   if k.lower() in ("authorization", "x-request-id", "content-type")}
        body = await raw.json()
        with prefills.using(prefills.pick()) as url:
            # A client that leaves cancels the upstream request (its instance aborts it).
            first = await cancel_on_disconnect(
                raw, http.post(url + path, json=_prefill_body(body), headers=headers))
        if first is None:
            return Response(status_code=499)
        if first.status_code != 200:
            return Response(first.content, first.status_code,
                            media_type=first.headers.get("content-type"))
        params = first.json().get("kv_transfer_params")
        decode_body = {**body, "kv_transfer_params": params} if params else dict(body)
        url = decodes.pick()
        if not body.get("stream"):
            with decodes.using(url):
                answer = await cancel_on_disconnect(
                    raw, http.post(url + path, json=decode_body, headers=headers))
            if answer is None:
                return Response(status_code=499)
            return Response(answer.content, answer.status_code,
                            media_type=answer.headers.get("content-type"))
        return await _stream(http, decodes, url + path, decode_body, headers, url)

    async def answer(path: str, raw: Request) -> Response:
        try:
            return await forward(path, raw)
        except httpx.HTTPError as error:  # an instance down or gone mid-request: never a hang
            return JSONResponse(error_body(
                f"An upstream instance failed: {error!r}.", HTTPStatus.BAD_GATEWAY),
                status_code=HTTPStatus.BAD_GATEWAY)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await answer("/v1/completions", raw)

    @app.post("/v1/chat/completions")
    async def chat(raw: Request) -> Response:
        return await answer("/v1/chat/completions", raw)

    @app.get("/v1/models")
    async def models() -> Response:
        answer = await http.get(decodes.urls[0] + "/v1/models")
        return Response(answer.content, answer.status_code,
                        media_type=answer.headers.get("content-type"))

    @app.get("/health")
    async def health() -> Response:
        for url in prefills.urls + decodes.urls:
            try:
                if (await http.get(url + "/health")).status_code != 200:
                    return JSONResponse({"unhealthy": url}, status_code=503)
            except httpx.HTTPError:
                return JSONResponse({"unreachable": url}, status_code=503)
        return Response(status_code=200)

    return app


async def _stream(http: httpx.AsyncClient, decodes: Upstreams, target: str,
                  body: dict[str, Any], headers: dict[str, str], url: str) -> Response:
    """The decode instance's stream, passed through; closing it (the client left)
    closes the upstream request, which the instance aborts."""
    request = http.build_request("POST", target, json=body, headers=headers)
    upstream = await http.send(request, stream=True)
    if upstream.status_code != 200:
        content = await upstream.aread()
        await upstream.aclose()
        return Response(content, upstream.status_code,
                        media_type=upstream.headers.get("content-type"))

    async def relay() -> AsyncIterator[bytes]:
        with decodes.using(url):
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

    return StreamingResponse(relay(), media_type="text/event-stream")


def make_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The proxy's flags."""
    parser = parser or argparse.ArgumentParser(prog="pagedllm disagg-proxy",
                                               description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", nargs="+", required=True, metavar="URL",
                        help="Prefill instances (kv_producer), e.g. http://127.0.0.1:8100.")
    parser.add_argument("--decode", nargs="+", required=True, metavar="URL",
                        help="Decode instances (kv_consumer).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Run the proxy until interrupted."""
    import uvicorn

    args = make_parser().parse_args(argv)
    strip = [url.rstrip("/") for url in args.prefill], [url.rstrip("/") for url in args.decode]
    uvicorn.run(build_app(*strip), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
