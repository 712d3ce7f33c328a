"""The OpenAI-compatible HTTP server: app factory, lifespan, routes, API-key check, runner.

`build_app(engine, server_args)` wires the handlers (`serving_*.py`) to FastAPI routes;
`run_server` loads the engine, binds the port and runs uvicorn. The engine core steps in its
own process (or a background thread with --no-multiprocessing), so the event loop keeps
serving HTTP while the model runs. A watchdog checks the core twice a second: once it died,
requests fail with 503, /health answers 503, and the server stops with exit code 1 so an
orchestrator restarts it.
Run it as `pagedllm serve [MODEL]` or `python -m pagedllm.entrypoints.openai.api_server`.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.util
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import wraps
from http import HTTPStatus
from typing import Annotated, Any

import uvicorn
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedllm import __version__, envs
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.engine.exceptions import EngineDeadError
from pagedllm.entrypoints.openai.dashboard import dashboard_router
from pagedllm.entrypoints.openai.drain import DrainingServer, DrainMiddleware
from pagedllm.entrypoints.openai.errors import (
    APIError,
    error_body,
    error_response,
    install_error_handlers,
    validation_message,
)
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
    random_uuid,
)
from pagedllm.entrypoints.openai.protocol_pooling import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from pagedllm.entrypoints.openai.served_models import ServedModels, parse_lora_modules
from pagedllm.entrypoints.openai.server_args import ServerArgs
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedllm.entrypoints.openai.serving_engine import ServingConfig
from pagedllm.entrypoints.openai.serving_messages import ServingMessages, anthropic_error
from pagedllm.entrypoints.openai.serving_models import OpenAIServingModels
from pagedllm.entrypoints.openai.serving_pooling import OpenAIServingPooling
from pagedllm.entrypoints.openai.serving_responses import OpenAIServingResponses
from pagedllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from pagedllm.logger import init_logger
from pagedllm.model_loader.source import DEFAULT_MODEL
from pagedllm.multimodal.media import MediaConnector, video_num_frames
from pagedllm.reasoning import reasoning_parser_or_none

logger = init_logger(__name__)
router = APIRouter()
# Opened only with PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING=true (as vLLM does).
lora_router = APIRouter()
# Opened by --enable-tokenizer-info-endpoint and --enable-server-load-tracking.
tokenizer_info_router = APIRouter()
load_router = APIRouter()
sleep_router = APIRouter()  # with --enable-sleep-mode


def _handlers(request: Request) -> Any:
    return request.app.state


def _answer_errors(endpoint: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Turn any exception of a handler into the OpenAI error JSON (the server keeps going)."""

    @wraps(endpoint)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await endpoint(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - every error becomes a response
            return error_response(error)

    return wrapper


@router.get("/health")
async def health(raw_request: Request) -> Response:
    """200 while the engine runs, 503 once it died."""
    try:
        _handlers(raw_request).engine.check_health()
    except EngineDeadError:
        return Response(status_code=HTTPStatus.SERVICE_UNAVAILABLE)
    return Response(status_code=HTTPStatus.OK)


@router.get("/ping")
@router.post("/ping")
async def ping(raw_request: Request) -> Response:
    """SageMaker-style health check (same as /health)."""
    return await health(raw_request)


@router.get("/version")
async def version() -> JSONResponse:
    """The pagedllm version."""
    return JSONResponse({"version": __version__})


@router.get("/metrics")
async def metrics(raw_request: Request) -> Response:
    """Prometheus metrics (text exposition format)."""
    prometheus = _handlers(raw_request).engine.prometheus
    body = prometheus.render() if prometheus is not None else b""
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
@_answer_errors
async def list_models(raw_request: Request) -> JSONResponse:
    """The served model names."""
    return JSONResponse(_handlers(raw_request).models.list_models().model_dump())


@lora_router.post("/v1/load_lora_adapter")
@_answer_errors
async def load_lora_adapter(request: LoadLoRAAdapterRequest, raw_request: Request) -> Response:
    """Serve a LoRA adapter under a new name (PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING=true)."""
    message = await _handlers(raw_request).models.load_lora_adapter(request)
    return PlainTextResponse(message)


@lora_router.post("/v1/unload_lora_adapter")
@_answer_errors
async def unload_lora_adapter(request: UnloadLoRAAdapterRequest, raw_request: Request) -> Response:
    """Stop serving a LoRA adapter (PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING=true)."""
    message = await _handlers(raw_request).models.unload_lora_adapter(request)
    return PlainTextResponse(message)


@router.post("/v1/completions")
@_answer_errors
async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
    """OpenAI completions."""
    return await _handlers(raw_request).completion.create_completion(request, raw_request)


@router.post("/v1/chat/completions")
@_answer_errors
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
    """OpenAI chat completions."""
    return await _handlers(raw_request).chat.create_chat_completion(request, raw_request)


@router.post("/v1/embeddings")
@_answer_errors
async def create_embedding(request: EmbeddingRequest, raw_request: Request) -> Response:
    """OpenAI embeddings (pooling models, or a generating one started with convert=embed)."""
    return await _handlers(raw_request).pooling.create_embedding(request, raw_request)


@router.post("/pooling")
@_answer_errors
async def create_pooling(request: PoolingRequest, raw_request: Request) -> Response:
    """The model's raw pooled outputs."""
    return await _handlers(raw_request).pooling.create_pooling(request, raw_request)


@router.post("/classify")
@_answer_errors
async def create_classify(request: ClassificationRequest, raw_request: Request) -> Response:
    """Class probabilities of each input."""
    return await _handlers(raw_request).pooling.create_classify(request, raw_request)


@router.post("/score")
@router.post("/v1/score")
@_answer_errors
async def create_score(request: ScoreRequest, raw_request: Request) -> Response:
    """Scores of text pairs (cross-encoder, or cosine of embeddings)."""
    return await _handlers(raw_request).pooling.create_score(request, raw_request)


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
@_answer_errors
async def create_rerank(request: RerankRequest, raw_request: Request) -> Response:
    """Documents ordered by relevance to a query (Jina / Cohere shape)."""
    return await _handlers(raw_request).pooling.create_rerank(request, raw_request)


@router.post("/reset_prefix_cache")
@_answer_errors
async def reset_prefix_cache(raw_request: Request) -> Response:
    """Forget the prefix cache (vLLM's route): 200 when done, 409 while requests hold
    blocks (nothing is dropped then)."""
    if await _handlers(raw_request).engine.reset_prefix_cache():
        return Response(status_code=200)
    raise APIError("Requests are running: the prefix cache was not reset; retry when idle.",
                   HTTPStatus.CONFLICT)


@sleep_router.post("/sleep")
@_answer_errors
async def sleep(raw_request: Request, level: int = 1) -> Response:
    """Give the KV cache (level 1) and the weights (level 2) back (vLLM's route; running
    requests are aborted, new ones wait for /wake_up)."""
    await _handlers(raw_request).engine.sleep(level)
    return Response(status_code=200)


@sleep_router.post("/wake_up")
@_answer_errors
async def wake_up(raw_request: Request, tags: Annotated[list[str] | None, Query()] = None
                  ) -> Response:
    """Take back what /sleep gave (`?tags=weights&tags=kv_cache`; none: everything)."""
    await _handlers(raw_request).engine.wake_up(tags or None)
    return Response(status_code=200)


@sleep_router.get("/is_sleeping")
@_answer_errors
async def is_sleeping(raw_request: Request) -> JSONResponse:
    """`{"is_sleeping": bool}`."""
    return JSONResponse({"is_sleeping": await _handlers(raw_request).engine.is_sleeping()})


@router.get("/server_info")
async def server_info(raw_request: Request) -> JSONResponse:
    """The engine's resolved configuration and the version (vLLM's /server_info)."""
    engine = _handlers(raw_request).engine
    return JSONResponse({"version": __version__,
                         "pagedllm_config": repr(engine.engine_config)})


@router.post("/v1/messages")
async def create_message(raw_request: Request) -> Response:
    """Anthropic's Messages API (serving_messages.py: over chat completions); errors in
    Anthropic's shape."""
    try:
        body = await raw_request.json()
        return await _handlers(raw_request).messages.create(body, raw_request)
    except APIError as error:
        return anthropic_error(int(error.status), error.message)
    except RequestValidationError as error:
        return anthropic_error(400, validation_message(error)[0])
    except ValueError as error:
        return anthropic_error(400, str(error) or "The request body is not valid JSON.")


@router.post("/v1/responses")
@_answer_errors
async def create_response(raw_request: Request) -> Response:
    """OpenAI's Responses API (serving_responses.py: over chat completions)."""
    try:
        body = await raw_request.json()
    except ValueError:
        raise APIError("The request body is not valid JSON.") from None
    return await _handlers(raw_request).responses.create(body, raw_request)


@router.get("/v1/responses/{response_id}")
@_answer_errors
async def retrieve_response(response_id: str, raw_request: Request) -> JSONResponse:
    """A stored response."""
    return JSONResponse(_handlers(raw_request).responses.get(response_id))


@router.post("/v1/responses/{response_id}/cancel")
@_answer_errors
async def cancel_response(response_id: str, raw_request: Request) -> JSONResponse:
    """Cancel a background response (none run in the background here: 400)."""
    return JSONResponse(_handlers(raw_request).responses.cancel(response_id))


# SageMaker's route, which vLLM serves: the request kind is read from the body's fields.
_INVOCATION_KINDS = (("messages", "chat"), ("prompt", "completion"), ("input", "embedding"))


@router.post("/invocations")
@_answer_errors
async def invocations(raw_request: Request) -> Response:
    """SageMaker's single route: a chat (`messages`), completion (`prompt`) or embedding
    (`input`) request, answered as its own route answers it."""
    try:
        body = await raw_request.json()
    except ValueError:
        raise APIError("The request body is not valid JSON.") from None
    kind = next((k for field, k in _INVOCATION_KINDS
                 if isinstance(body, dict) and field in body), None)
    if kind is None:
        raise APIError("/invocations takes a chat (messages), completion (prompt) or "
                       "embedding (input) request.")
    handlers = _handlers(raw_request)
    try:
        if kind == "chat":
            chat = ChatCompletionRequest.model_validate(body)
            return await handlers.chat.create_chat_completion(chat, raw_request)
        if kind == "completion":
            completion = CompletionRequest.model_validate(body)
            return await handlers.completion.create_completion(completion, raw_request)
        embedding = EmbeddingRequest.model_validate(body)
        return await handlers.pooling.create_embedding(embedding, raw_request)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None


@router.post("/tokenize")
@_answer_errors
async def tokenize(request: TokenizeRequest, raw_request: Request) -> JSONResponse:
    """Tokenize a prompt or chat messages."""
    return JSONResponse(await _handlers(raw_request).tokenization.tokenize_request(request))


@router.post("/detokenize")
@_answer_errors
async def detokenize(request: DetokenizeRequest, raw_request: Request) -> JSONResponse:
    """Turn token ids back into text."""
    return JSONResponse(_handlers(raw_request).tokenization.detokenize_request(request))


@tokenizer_info_router.get("/tokenizer_info")
async def tokenizer_info(raw_request: Request) -> JSONResponse:
    """The tokenizer's class, vocabulary size, special tokens and chat template
    (--enable-tokenizer-info-endpoint)."""
    return JSONResponse(_handlers(raw_request).tokenization.tokenizer_info())


@load_router.get("/load")
async def server_load(raw_request: Request) -> JSONResponse:
    """How many requests are in flight (--enable-server-load-tracking)."""
    return JSONResponse({"server_load": _handlers(raw_request).server_load})


class LoadTrackingMiddleware:
    """Counts the model requests in flight for /load (plain ASGI: a stream counts until its
    last byte)."""

    _COUNTED = ("/v1/", "/invocations", "/pooling", "/classify", "/score", "/rerank")

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(self._COUNTED):
            await self.app(scope, receive, send)
            return
        self.state.server_load += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.server_load -= 1


class RequestIdMiddleware:
    """X-Request-Id on every response (--enable-request-id-headers): the request's own,
    else a new one (plain ASGI: streams untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id")
        request_id = given or random_uuid().encode()

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class APIKeyMiddleware:
    """401 (OpenAI error JSON) for /v1/* without `Authorization: Bearer <key>` (plain ASGI:
    streams untouched)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.key = api_key.encode()  # Anthropic's clients send it as x-api-key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and (path == "/v1" or path.startswith("/v1/"))):
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            if not (hmac.compare_digest(given, self.expected)
                    or hmac.compare_digest(headers.get(b"x-api-key", b""), self.key)):
                body = error_body("Unauthorized: pass a valid API key as `Authorization: "
                                  "Bearer KEY`.", HTTPStatus.UNAUTHORIZED)
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(engine: AsyncLLM, server_args: ServerArgs, model: str | None = None) -> FastAPI:
    """The FastAPI app serving `engine`; its lifespan shuts the engine down at exit.

    Args:
        model: the model argument the engine was built from (names the served model).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watchdog = asyncio.create_task(_watch_engine(app))
        try:
            yield
        finally:
            watchdog.cancel()
            engine.shutdown()

    app = FastAPI(title="pagedllm OpenAI-compatible server", version=__version__,
                  lifespan=lifespan, root_path=server_args.root_path)
    models = ServedModels(
        engine, tuple(served_model_names(server_args, model or engine.get_model_config().model))
    )
    models.load_static(parse_lora_modules(server_args.lora_modules))
    config = ServingConfig(
        models=models,
        chat_template=server_args.resolved_chat_template(),
        tool_call_parser=server_args.tool_call_parser,
        enable_auto_tool_choice=server_args.enable_auto_tool_choice,
        exclude_tools_when_tool_choice_none=server_args.exclude_tools_when_tool_choice_none,
        grammar_backend=engine.engine_config.structured_outputs_config.resolved_backend,
        media=MediaConnector(server_args.allowed_local_media_path,
                             server_args.allowed_media_domains,
                             video_num_frames=video_num_frames(server_args.media_io_kwargs)),
        return_tokens_as_token_ids=server_args.return_tokens_as_token_ids,
        force_include_usage=server_args.enable_force_include_usage,
        per_request_metrics=server_args.enable_per_request_metrics,
        generation_config=server_args.generation_config,
        reasoning_parser=reasoning_parser_or_none(
            engine.engine_config.structured_outputs_config.reasoning_parser),
    )
    state = app.state
    state.engine = engine
    state.completion = OpenAIServingCompletion(engine, config)
    state.chat = OpenAIServingChat(engine, config)
    state.responses = OpenAIServingResponses(state.chat)
    state.messages = ServingMessages(state.chat)
    state.models = OpenAIServingModels(engine, config)
    state.tokenization = OpenAIServingTokenization(engine, config)
    state.pooling = OpenAIServingPooling(engine, config)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(dashboard_router)
    if envs.allow_runtime_lora_updating():
        app.include_router(lora_router)
    api_key = server_args.resolved_api_key()
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if server_args.enable_tokenizer_info_endpoint:
        app.include_router(tokenizer_info_router)
    if engine.engine_config.model_config.enable_sleep_mode:
        app.include_router(sleep_router)
    if server_args.enable_server_load_tracking:
        state.server_load = 0
        app.include_router(load_router)
        app.add_middleware(LoadTrackingMiddleware, state=state)
    if server_args.enable_request_id_headers:
        app.add_middleware(RequestIdMiddleware)
    app.add_middleware(DrainMiddleware, state=state)  # outermost: 503 while draining
    return app


_WATCHDOG_INTERVAL_S = 0.5


async def _watch_engine(app: FastAPI) -> None:
    """Stop the server (uvicorn in `app.state.uvicorn_server`, if any) once the core died."""
    while True:
        await asyncio.sleep(_WATCHDOG_INTERVAL_S)
        try:
            app.state.engine.check_health()
        except EngineDeadError as error:
            logger.error("%s Shutting the server down.", error)
            app.state.engine_dead = True
            server = getattr(app.state, "uvicorn_server", None)
            if server is not None:
                server.should_exit = True
            return


def served_model_names(server_args: ServerArgs, model: str | None) -> list[str]:
    """--served-model-name, else the model argument, else the default model's name."""
    if server_args.served_model_name:
        return list(server_args.served_model_name)
    return [model or DEFAULT_MODEL]


def _bind_socket(host: str, port: int) -> socket.socket:
    # Bind before loading the model, so a taken port fails in a second, not after the load.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise SystemExit(f"Cannot listen on {host}:{port}: {error.strerror}.") from None
    return sock


def serving_stack() -> tuple[str, str]:
    """uvicorn's event loop and HTTP parser: uvloop and httptools (C; dependencies, as in
    vLLM's install) where importable, else asyncio's own loop and the pure-Python h11. Every
    streamed token is a write on its client's connection, so their cost is the API
    process's largest per token; measured in BENCHMARKS.md, "The API server's event loop"."""
    has = importlib.util.find_spec
    loop = "uvloop" if has("uvloop") is not None else "asyncio"
    http = "httptools" if has("httptools") is not None else "h11"
    return loop, http


def run_server(server_args: ServerArgs, engine_args: EngineArgs) -> None:
    """Load the engine and serve until interrupted (SIGTERM drains first: drain.py)."""
    sock = _bind_socket(server_args.host, server_args.port)
    names = served_model_names(server_args, engine_args.model)
    engine = AsyncLLM.from_engine_args(
        engine_args, log_stats=not server_args.disable_log_stats, model_name=names[0],
        multiprocessing=server_args.multiprocessing,
    )
    try:
        app = build_app(engine, server_args, engine_args.model or DEFAULT_MODEL)
        loop, http = serving_stack()
        config = uvicorn.Config(
            app, loop=loop, http=http, log_level=server_args.uvicorn_log_level,
            timeout_keep_alive=server_args.timeout_keep_alive, timeout_graceful_shutdown=5,
        )
        server = DrainingServer(config, app.state, engine.get_num_unfinished_requests,
                                server_args.shutdown_timeout)
        app.state.uvicorn_server = server
        logger.info("Serving %s on http://%s:%d (OpenAI-compatible API under /v1; %s, %s).",
                    names[0], server_args.host, server_args.port, loop, http)
        server.run(sockets=[sock])
    finally:
        engine.shutdown()  # idempotent; the lifespan normally did it already
    if getattr(app.state, "engine_dead", False):
        logger.error("Exiting with code 1: the engine core died.")
        sys.exit(1)


if __name__ == "__main__":
    import sys

    from pagedllm.entrypoints.cli import main

    main(["serve", *sys.argv[1:]])
