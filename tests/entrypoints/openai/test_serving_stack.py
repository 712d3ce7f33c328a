"""The server's event loop and HTTP parser: uvloop and httptools (dependencies) where they
import, else asyncio's loop and h11, and uvicorn builds its server from either pair."""

from __future__ import annotations

import importlib.util

import pytest
import uvicorn

from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.api_server import serving_stack


def test_the_c_loop_and_parser_are_chosen_where_installed() -> None:
    pytest.importorskip("uvloop")
    pytest.importorskip("httptools")
    assert serving_stack() == ("uvloop", "httptools")


def test_without_them_the_server_falls_back_to_asyncio_and_h11(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def without(name: str, *args: object) -> object:
        return None if name in ("uvloop", "httptools") else real(name, *args)

    monkeypatch.setattr(api_server.importlib.util, "find_spec", without)
    assert serving_stack() == ("asyncio", "h11")


@pytest.mark.parametrize("fallback", [False, True])
def test_uvicorn_loads_the_chosen_pair(fallback: bool) -> None:
    """uvicorn resolves both names to its protocol class and loop setup (a name it does not
    know raises here, not at the first request)."""
    loop, http = ("asyncio", "h11") if fallback else serving_stack()

    async def app(scope: object, receive: object, send: object) -> None:  # pragma: no cover
        pass

    config = uvicorn.Config(app, loop=loop, http=http)
    config.load()
    expected = {"h11": "H11Protocol", "httptools": "HttpToolsProtocol"}[http]
    assert config.http_protocol_class.__name__ == expected
    factory = config.get_loop_factory()
    assert factory is not None and factory.__module__.split(".")[0] == loop
