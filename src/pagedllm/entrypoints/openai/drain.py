"""Draining on SIGTERM: running requests finish, new ones are turned away, then the server
stops.

The first SIGTERM marks the app as draining: from then on every request but /health,
/metrics, /ping, /version and the dashboard is answered 503 (OpenAI error JSON) while the
listening socket stays open, so a load balancer sees the refusal instead of a connection
error. A thread waits until the engine has no unfinished request, or `--shutdown-timeout`
seconds, then asks uvicorn to stop (streams still running then are cut when the engine shuts
down). A second SIGTERM, or SIGINT, stops at once as before.
"""

from __future__ import annotations

import signal
import threading
import time
from http import HTTPStatus
from types import FrameType
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedllm.entrypoints.openai.errors import error_body
from pagedllm.logger import init_logger

logger = init_logger(__name__)

_OPEN_PATHS = (
    "/health", "/metrics", "/ping", "/version", "/dashboard", "/dashboard/state",
)
_POLL_S = 0.1
_CUT_AFTER_S = 1  # after the timeout: a second to flush what was sent, then cut


class DrainMiddleware:
    """503 for every request (but the open paths) once `state.draining` is set."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and getattr(self.state, "draining", False)
                and scope.get("path", "") not in _OPEN_PATHS):
            body = error_body("The server is shutting down; retry on another replica.",
                              HTTPStatus.SERVICE_UNAVAILABLE)
            await JSONResponse(body, status_code=503)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a draining first SIGTERM (see the module docstring).

    Args:
        config: uvicorn's config.
        state: the app's state (`draining` is set on it).
        num_unfinished: how many requests the engine still runs.
        shutdown_timeout: the most seconds to wait for them.
    """

    def __init__(self, config: uvicorn.Config, state: Any, num_unfinished: Any,
                 shutdown_timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.num_unfinished = num_unfinished
        self.shutdown_timeout = shutdown_timeout

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Drain on the first SIGTERM; otherwise uvicorn's own handling."""
        if sig != signal.SIGTERM or getattr(self.state, "draining", False):
            super().handle_exit(sig, frame)
            return
        self.state.draining = True
        logger.info("SIGTERM: draining %d running request(s) (at most %.0f s); new requests "
                    "get 503.", self.num_unfinished(), self.shutdown_timeout)
        threading.Thread(target=self._drain, name="pagedllm-drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout
        while self.num_unfinished() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        left = self.num_unfinished()
        if left:
            logger.warning("Shutdown timeout: stopping with %d request(s) still running.", left)
            # The timeout was the drain: uvicorn's own grace period would let them run on.
            self.config.timeout_graceful_shutdown = _CUT_AFTER_S
        self.should_exit = True
