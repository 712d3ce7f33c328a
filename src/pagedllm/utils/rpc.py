"""`collective_rpc` calls as bytes: how a Worker method's name or a function, with its
arguments, travels from the frontend through the engine core to every worker process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import cloudpickle


def encode_rpc(method: str | Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any] | None) -> bytes:
    """A `collective_rpc` call as bytes: a Worker method's name or a function (called with
    the worker first), pickled by value with cloudpickle so lambdas and local functions
    travel to worker processes too."""
    if not (isinstance(method, str) or callable(method)):
        raise ValueError(f"method must be a Worker method's name or a callable, got "
                         f"{type(method).__name__}.")
    if not isinstance(args, tuple | list):
        raise ValueError(f"args must be a tuple, got {type(args).__name__}.")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"kwargs must be a dict, got {type(kwargs).__name__}.")
    return cloudpickle.dumps((method, tuple(args), dict(kwargs or {})))


def decode_rpc(payload: bytes) -> tuple[str | Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The (method, args, kwargs) of an encoded call."""
    return cast("tuple[Any, tuple[Any, ...], dict[str, Any]]", cloudpickle.loads(payload))
