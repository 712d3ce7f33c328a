"""Per-request timing on responses (`--enable-per-request-metrics`) and ORCA load reports
(the `endpoint-load-metrics` header a load balancer asks for), both in vLLM's shapes.

Timing comes from a finished request's `RequestOutput.metrics`; the load report from the
engine's latest scheduler stats. Nothing here runs the model.
"""

from __future__ import annotations

import json
from typing import Any

from pagedllm.entrypoints.openai.protocol import PerRequestTimingMetrics
from pagedllm.logger import init_logger
from pagedllm.outputs import RequestOutput

logger = init_logger(__name__)

# The request header that asks for a load report, and the response header carrying it.
ORCA_FORMAT_HEADER = "endpoint-load-metrics-format"
ORCA_REPORT_HEADER = "endpoint-load-metrics"


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else (end - start) * 1000.0


def timing_metrics(output: RequestOutput, num_generated: int) -> PerRequestTimingMetrics:
    """The timing of one request from its (final) output."""
    metrics = output.metrics
    if metrics is None:
        return PerRequestTimingMetrics()
    scheduled, first, last = (metrics.first_scheduled_time, metrics.first_token_time,
                              metrics.last_token_time)
    generation = _ms(first, last)
    active = _ms(scheduled, last)
    return PerRequestTimingMetrics(
        time_to_first_token_ms=_ms(scheduled, first),
        generation_time_ms=generation,
        queue_time_ms=None if metrics.time_in_queue is None else metrics.time_in_queue * 1000.0,
        mean_itl_ms=(generation / (num_generated - 1)
                     if generation is not None and num_generated > 1 else None),
        tokens_per_second=(num_generated * 1000.0 / active if active else None),
    )


def orca_headers(requested_format: str | None, stats: Any) -> dict[str, str]:
    """The `endpoint-load-metrics` header for a request that asked for one (TEXT or JSON,
    any case; anything else is logged and answered without it): the KV cache usage and
    the number of waiting requests, as vLLM reports them."""
    if not requested_format:
        return {}
    kind = requested_format.strip().upper()
    if kind not in ("TEXT", "JSON"):
        logger.warning("Unsupported %s %r (TEXT or JSON); no load report sent.",
                       ORCA_FORMAT_HEADER, requested_format)
        return {}
    named = {
        "kv_cache_usage_perc": float(getattr(stats, "kv_cache_usage", 0.0)),
        "num_requests_waiting": float(getattr(stats, "num_waiting_reqs", 0)),
    }
    if kind == "JSON":
        return {ORCA_REPORT_HEADER: "JSON " + json.dumps({"named_metrics": named})}
    text = ", ".join(f"named_metrics.{name}={value}" for name, value in named.items())
    return {ORCA_REPORT_HEADER: "TEXT " + text}
