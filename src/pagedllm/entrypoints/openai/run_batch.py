"""`pagedllm run-batch`: OpenAI's batch file format, run through the server's own routes.

Each input line is `{"custom_id", "method": "POST", "url", "body"}` for /v1/chat/completions,
/v1/completions, /v1/embeddings, /v1/score (/score) or /v1/rerank (/rerank). Every line goes
through the same FastAPI app `pagedllm serve` builds, in-process (no port), so a line's
answer is exactly the server's: its body, or its status code and OpenAI error. Each output
line is `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`,
in input order; a malformed line (not JSON, missing fields, another method or route, a
stream) gets an error record and the batch goes on. Inputs and outputs may be local files
or http(s) URLs (GET to read, PUT to write). Lines run concurrently, up to twice the
engine's max_num_seqs at a time, so the engine batches them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx

from pagedllm.entrypoints.openai.errors import error_body
from pagedllm.entrypoints.openai.protocol import random_uuid
from pagedllm.logger import init_logger

logger = init_logger(__name__)

# The routes a batch line may name, as the server serves them.
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/score",
              "/score", "/v1/rerank", "/rerank")
_URL_TIMEOUT_S = 300.0


@dataclass
class BatchLine:
    """One input line, parsed: its route and body, or why it cannot run."""

    custom_id: str | None
    url: str | None = None
    body: dict[str, Any] | None = None
    error: str | None = None


def parse_line(text: str) -> BatchLine:
    """Parse one input line; a malformed one comes back with `error` set."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return BatchLine(None, error=f"The line is not valid JSON: {exc}.")
    if not isinstance(data, dict):
        return BatchLine(None, error="A batch line must be a JSON object.")
    custom_id = data.get("custom_id")
    custom_id = custom_id if isinstance(custom_id, str) else None
    if custom_id is None:
        return BatchLine(None, error="custom_id must be a string.")
    method, url, body = data.get("method", "POST"), data.get("url"), data.get("body")
    if method != "POST":
        return BatchLine(custom_id, error=f"method must be POST, got {method!r}.")
    if url not in BATCH_URLS:
        return BatchLine(custom_id, error=f"url {url!r} is not served by run-batch; "
                                          f"supported: {', '.join(BATCH_URLS)}.")
    if not isinstance(body, dict):
        return BatchLine(custom_id, error="body must be a JSON object.")
    if body.get("stream"):
        return BatchLine(custom_id, error="A batch request must not be streamed (stream).")
    return BatchLine(custom_id, url, body)


def output_record(custom_id: str | None, status: int, body: Any) -> dict[str, Any]:
    """One output line: the body of a 200, else the status and the error (vLLM's shape)."""
    ok = status == HTTPStatus.OK
    return {
        "id": f"batch-{random_uuid()}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": f"batch-req-{random_uuid()}",
                     "body": body if ok else None},
        "error": None if ok else body,
    }


def _line_error(line: BatchLine) -> dict[str, Any]:
    assert line.error is not None
    return output_record(line.custom_id, HTTPStatus.BAD_REQUEST,
                         error_body(line.error, HTTPStatus.BAD_REQUEST))


async def read_lines(path_or_url: str) -> list[str]:
    """The non-empty lines of a local file or an http(s) URL."""
    if path_or_url.startswith(("http://", "https://")):
        async with httpx.AsyncClient(timeout=_URL_TIMEOUT_S) as client:
            response = await client.get(path_or_url)
            response.raise_for_status()
            text = response.text
    else:
        text = Path(path_or_url).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


async def write_lines(path_or_url: str, records: list[dict[str, Any]]) -> None:
    """Write the records as JSON lines to a local file, or PUT them to an http(s) URL."""
    text = "".join(json.dumps(record) + "\n" for record in records)
    if path_or_url.startswith(("http://", "https://")):
        async with httpx.AsyncClient(timeout=_URL_TIMEOUT_S) as client:
            response = await client.put(path_or_url, content=text.encode())
            response.raise_for_status()
    else:
        Path(path_or_url).write_text(text, encoding="utf-8")


async def run_lines(
    lines: list[str], send: Callable[[str, dict[str, Any]], Awaitable[httpx.Response]],
    concurrency: int, progress: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """Every line's output record, in input order; `send(url, body)` answers one request."""
    gate = asyncio.Semaphore(concurrency)

    async def one(text: str) -> dict[str, Any]:
        line = parse_line(text)
        try:
            if line.error is not None:
                return _line_error(line)
            assert line.url is not None and line.body is not None
            async with gate:
                response = await send(line.url, line.body)
            try:
                body = response.json()
            except ValueError:
                body = error_body(response.text or "empty response", HTTPStatus(
                    response.status_code))
            return output_record(line.custom_id, response.status_code, body)
        finally:
            progress()

    return list(await asyncio.gather(*(one(text) for text in lines)))


def run_batch(server_args: Any, engine_args: Any, input_file: str, output_file: str) -> int:
    """Load the engine, run the file through the server's app, write the results; the exit
    code (0, also when some lines failed: they are in the output)."""
    from pagedllm.engine.async_llm import AsyncLLM
    from pagedllm.entrypoints.openai.api_server import build_app, served_model_names
    from pagedllm.model_loader.source import DEFAULT_MODEL

    names = served_model_names(server_args, engine_args.model)
    engine = AsyncLLM.from_engine_args(engine_args, log_stats=False, model_name=names[0],
                                       multiprocessing=server_args.multiprocessing)
    try:
        app = build_app(engine, server_args, engine_args.model or DEFAULT_MODEL)
        asyncio.run(run_batch_file(app, input_file, output_file,
                                   concurrency=2 * engine_args.max_num_seqs,
                                   api_key=server_args.resolved_api_key()))
    finally:
        engine.shutdown()
    return 0


async def run_batch_file(app: Any, input_file: str, output_file: str, concurrency: int,
                         show_progress: bool = True, api_key: str | None = None,
                         ) -> list[dict[str, Any]]:
    """Run `input_file` through `app` (the server's FastAPI app) into `output_file`."""
    from tqdm import tqdm

    lines = await read_lines(input_file)
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(transport=transport, base_url="http://batch",
                                 timeout=None, headers=headers) as client:
        with tqdm(total=len(lines), desc="Running batch", unit="req",
                  disable=not show_progress) as bar:

            async def send(url: str, body: dict[str, Any]) -> httpx.Response:
                return await client.post(url, json=body)

            records = await run_lines(lines, send, concurrency, lambda: bar.update(1))
    await write_lines(output_file, records)
    failed = sum(1 for record in records if record["error"] is not None)
    logger.info("Batch done: %d lines, %d with an error; results in %s.", len(records),
                failed, output_file)
    return records
