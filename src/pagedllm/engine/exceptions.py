"""Errors the engine frontend raises to its callers (the API server, user code).

Only exception types live here; no logic.
"""

from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine core stopped (it crashed or was shut down); no request can run any more."""

    def __init__(self, message: str = "The engine core is dead; restart the server.") -> None:
        super().__init__(message)


class EngineStartupError(RuntimeError):
    """The engine core process could not start (bad model, KV cache too small, ...)."""
