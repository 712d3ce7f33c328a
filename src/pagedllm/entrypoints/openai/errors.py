"""Error responses of the OpenAI-compatible server, shaped as vLLM shapes them.

`{"error": {"message", "type", "param", "code"}}` where `code` is the HTTP status and `type`
names it (BadRequestError, NotFoundError, ...). Request validation errors become 400 (not
FastAPI's 422), as in vLLM. This module builds responses only; it never touches the engine.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedllm.engine.exceptions import EngineDeadError
from pagedllm.entrypoints.openai.protocol import UNBUILT_VLLM_FIELDS, ErrorInfo, ErrorResponse
from pagedllm.logger import init_logger

logger = init_logger(__name__)

_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.UNAUTHORIZED: "AuthenticationError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.METHOD_NOT_ALLOWED: "MethodNotAllowedError",
    HTTPStatus.CONFLICT: "ConflictError",
    HTTPStatus.NOT_IMPLEMENTED: "NotImplementedError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}
# Sentence starts of ValueErrors that name the offending field.
_PARAM_HINTS = (
    "n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens", "stop",
    "stop_token_ids", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logprobs", "prompt_logprobs", "logit_bias", "allowed_token_ids", "bad_words", "best_of",
    "priority", "messages", "prompt", "top_logprobs", "tokens", *UNBUILT_VLLM_FIELDS,
)

_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


class APIError(Exception):
    """An error the server answers with `status` and the OpenAI error body."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def guess_param(message: str) -> str | None:
    """The request field a validation message is about, when it names one."""
    lowered = message.lower().lstrip("`")
    names = sorted(_PARAM_HINTS, key=len, reverse=True)
    for name in names:
        if lowered.startswith(name + " ") or lowered.startswith(name + "`"):
            return name
    for name in names:
        if re.search(rf"\b(in|of) (the )?`?{name}\b|^the (decoder )?{name}\b", lowered):
            return name
    return None


def error_body(message: str, status: HTTPStatus, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response."""
    error_type = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "Error")
    info = ErrorInfo(message=message, type=error_type, param=param, code=int(status))
    return ErrorResponse(error=info).model_dump()


def error_response(error: Exception) -> JSONResponse:
    """Map an exception to its HTTP error response."""
    if isinstance(error, APIError):
        status, message, param = error.status, error.message, error.param
    elif isinstance(error, RequestValidationError):  # a body validated inside a handler
        status = HTTPStatus.BAD_REQUEST
        message, param = validation_message(error)
    elif isinstance(error, ValueError):
        status, message = HTTPStatus.BAD_REQUEST, str(error)
        param = guess_param(message)
    elif isinstance(error, NotImplementedError):
        status, message, param = HTTPStatus.NOT_IMPLEMENTED, str(error), None
    elif isinstance(error, EngineDeadError):
        status, message, param = HTTPStatus.INTERNAL_SERVER_ERROR, str(error), None
    else:
        logger.exception("Unexpected error while serving a request.", exc_info=error)
        status, param = HTTPStatus.INTERNAL_SERVER_ERROR, None
        message = f"Internal error: {error!r}"
    return JSONResponse(error_body(message, status, param), status_code=int(status))


def sse_error(error: Exception) -> str:
    """An error inside a stream that already sent its 200: one `data:` frame."""
    response = error_response(error)
    return f"data: {bytes(response.body).decode()}\n\n"


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A request validation error's message and the field it names (vLLM's wording)."""
    errors = exc.errors()
    lines: list[str] = []
    params: list[str | None] = []
    for err in errors:
        message = str(err.get("msg", "")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", message)
            lines.append(f"The request body is not valid JSON: {detail}.")
            params.append(None)
            continue
        loc = [str(part) for part in err.get("loc", ()) if part != "body"]
        # Unions and validators add their member type to the path; keep the field path only.
        loc = [part for part in loc if part not in _TYPE_TAGS and "[" not in part]
        params.append(".".join(loc) or guess_param(message))
        message += _constraint_suffix(err)
        lines.append(f"{'.'.join(loc) or 'body'}: {message}" if loc else message)
    if len(lines) == 1:
        return lines[0], params[0]
    count = f"{len(lines)} validation errors:\n  "
    return count + "\n  ".join(lines), next((p for p in params if p), None)


def _constraint_suffix(err: dict[str, Any]) -> str:
    """The failed constraint's type as pydantic names it (`greater_than_equal`, ...): vLLM's
    messages carry it and its clients match on it. A validator's own ValueError has none."""
    kind = str(err.get("type", ""))
    if not kind or kind in ("value_error", "assertion_error"):
        return ""
    return f" [type={kind}]"


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every error into the error JSON."""

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return JSONResponse(error_body(message, HTTPStatus.BAD_REQUEST, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = HTTPStatus(exc.status_code)
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return JSONResponse(error_body(detail, status), status_code=exc.status_code)

    @app.exception_handler(APIError)
    async def _on_api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def _on_other(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)
