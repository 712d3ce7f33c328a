"""Offline metrics: the engine's latest `SchedulerStats` as vLLM's metric records.

`LLM.get_metrics()` returns these (vLLM's `vllm.v1.metrics.reader` shapes: Counter, Gauge,
Vector), named as the server's Prometheus metrics (`pagedllm:...`), so a notebook reads the
same numbers `/metrics` serves: queue sizes, KV usage, prefix-cache hits, preemptions and
speculative decoding's acceptance. This module must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedllm.metrics.loggers import PREFIX
from pagedllm.metrics.stats import SchedulerStats


@dataclass
class Metric:
    """A metric's name and labels."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Counter(Metric):
    """A cumulative count."""

    value: int | float = 0


@dataclass
class Gauge(Metric):
    """A value at the time of the last step."""

    value: float = 0.0


@dataclass
class Vector(Metric):
    """Cumulative counts by position (acceptances per draft position)."""

    values: list[int] = field(default_factory=list)


def metrics_from_stats(stats: SchedulerStats | None) -> list[Metric]:
    """vLLM-style records of `stats` (none before the first step)."""
    if stats is None:
        return []
    return [
        Gauge(PREFIX + "num_requests_running", value=stats.num_running_reqs),
        Gauge(PREFIX + "num_requests_waiting", value=stats.num_waiting_reqs),
        Gauge(PREFIX + "kv_cache_usage_perc", value=stats.kv_cache_usage),
        Gauge(PREFIX + "encoder_cache_usage_perc", value=stats.encoder_cache_usage),
        Counter(PREFIX + "num_preemptions", value=stats.num_preemptions),
        Counter(PREFIX + "prefix_cache_queries", value=stats.prefix_cache_queries),
        Counter(PREFIX + "prefix_cache_hits", value=stats.prefix_cache_hits),
        Counter(PREFIX + "spec_decode_num_drafts", value=stats.spec_num_drafts),
        Counter(PREFIX + "spec_decode_num_draft_tokens", value=stats.spec_num_draft_tokens),
        Counter(
            PREFIX + "spec_decode_num_accepted_tokens", value=stats.spec_num_accepted_tokens
        ),
        Vector(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            values=list(stats.spec_accepted_per_pos),
        ),
    ]
