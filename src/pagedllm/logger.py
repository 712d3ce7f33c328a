"""`init_logger(name)`: one logging format for the whole package."""

from __future__ import annotations

import logging

_FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"
_configured = False


def init_logger(name: str) -> logging.Logger:
    """Return the package logger for `name`, configuring the root pagedllm handler once."""
    global _configured
    if not _configured:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root = logging.getLogger("pagedllm")
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        _configured = True
    return logging.getLogger(name)
