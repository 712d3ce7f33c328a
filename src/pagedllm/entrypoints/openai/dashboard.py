"""The live dashboard: a static page at /dashboard polling the JSON at /dashboard/state.

The state joins what the engine core knows (running / waiting / swapped counts, each KV
block's state, each listed request's progress: core/snapshot.py, one utility call between
steps) with what the API process measured (token totals, the TTFT and inter-token latency
histograms of its Prometheus metrics). The page computes rates between polls and draws with
a canvas; it loads nothing from outside the server. Like /metrics it needs no API key.
"""

from __future__ import annotations

import time
from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from pagedllm.entrypoints.openai.errors import error_response

dashboard_router = APIRouter()


@cache
def _page() -> str:
    return (resources.files("pagedllm.entrypoints.openai") / "static" / "dashboard.html"
            ).read_text(encoding="utf-8")


@dashboard_router.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> HTMLResponse:
    """The dashboard page."""
    return HTMLResponse(_page())


@dashboard_router.get("/dashboard/state")
async def dashboard_state(raw_request: Request) -> Response:
    """The numbers the page draws, as of now."""
    state = raw_request.app.state
    engine = state.engine
    try:
        snapshot = await engine.dashboard_snapshot()
    except Exception as error:  # noqa: BLE001 - a dead engine answers its error JSON
        return error_response(error)
    prometheus = engine.prometheus
    return JSONResponse({
        "time": time.time(),
        "model": state.models.model_name,
        **snapshot,
        "metrics": prometheus.dashboard_view() if prometheus is not None else None,
    })
