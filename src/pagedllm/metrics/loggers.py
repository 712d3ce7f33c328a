"""Stat loggers: a periodic log line and a Prometheus exporter with vLLM's metric names.

Both consume the same three inputs: the core's `SchedulerStats` after a step, what a batch of
outputs meant per request (`IterationSample`), and finished requests
(`FinishedRequestSample`). Names follow vLLM V1 with a `pagedllm:` prefix, each labelled
`model_name` and `engine`; `/metrics` also shows every one of them under vLLM's own `vllm:`
prefix (`VllmNames`), plus the older vLLM names its published Grafana dashboard still
queries (`vllm:gpu_cache_usage_perc`, `vllm:cpu_cache_usage_perc`,
`vllm:time_per_output_token_seconds`), so dashboards and alerts built for vLLM read this
server unchanged. This module measures nothing itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from pagedllm.logger import init_logger
from pagedllm.metrics.request_timing import FinishedRequestSample, IterationSample

logger = init_logger(__name__)

PREFIX = "pagedllm:"
VLLM_PREFIX = "vllm:"
# Older vLLM names (still read by vLLM's published dashboard) -> the metric they alias.
VLLM_LEGACY_NAMES = {
    "gpu_cache_usage_perc": "kv_cache_usage_perc",
    "cpu_cache_usage_perc": "cpu_kv_cache_usage_perc",
    "time_per_output_token_seconds": "inter_token_latency_seconds",
}
FINISH_REASONS = ("stop", "length", "abort", "error")

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value` (token-count histograms)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class LoggingStatLogger:
    """Logs throughput, load and KV usage every `interval_s` while the engine is busy, and
    speculative decoding's acceptance over the interval when drafts were verified."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last_log = time.monotonic()
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._stats: Any = None
        # The spec decode counters at the previous log line (drafts, draft tokens,
        # accepted tokens, accepted per position).
        self._last_spec: tuple[int, int, int, list[int]] = (0, 0, 0, [])

    def record(self, scheduler_stats: Any, iteration: IterationSample | None) -> None:
        """Accumulate one batch, and log if the interval passed."""
        if scheduler_stats is not None:
            self._stats = scheduler_stats
        if iteration is not None:
            self._num_prompt_tokens += iteration.num_prompt_tokens
            self._num_generation_tokens += iteration.num_generation_tokens
        now = time.monotonic()
        if now - self._last_log >= self.interval_s:
            self._log(now)

    def _log(self, now: float) -> None:
        elapsed = now - self._last_log
        stats = self._stats
        if self._num_generation_tokens or (stats is not None and stats.num_running_reqs):
            logger.info(
                "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
                "tokens/s, Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%",
                self._num_prompt_tokens / elapsed,
                self._num_generation_tokens / elapsed,
                getattr(stats, "num_running_reqs", 0),
                getattr(stats, "num_waiting_reqs", 0),
                100.0 * getattr(stats, "kv_cache_usage", 0.0),
            )
        if stats is not None:
            self._log_spec_decoding(stats, elapsed)
        self._last_log = now
        self._num_prompt_tokens = self._num_generation_tokens = 0

    def _log_spec_decoding(self, stats: Any, elapsed: float) -> None:
        """vLLM's "SpecDecoding metrics" line, over the interval since the last one."""
        current = (
            int(getattr(stats, "spec_num_drafts", 0)),
            int(getattr(stats, "spec_num_draft_tokens", 0)),
            int(getattr(stats, "spec_num_accepted_tokens", 0)),
            list(getattr(stats, "spec_accepted_per_pos", [])),
        )
        drafts = current[0] - self._last_spec[0]
        draft_tokens = current[1] - self._last_spec[1]
        accepted = current[2] - self._last_spec[2]
        previous = self._last_spec[3]
        per_pos = [n - (previous[i] if i < len(previous) else 0) for i, n in enumerate(current[3])]
        self._last_spec = current
        if drafts <= 0:
            return
        logger.info(
            "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
            "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d "
            "tokens, Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
            1.0 + accepted / drafts,
            accepted / elapsed,
            draft_tokens / elapsed,
            accepted,
            draft_tokens,
            ", ".join(f"{n / drafts:.3f}" for n in per_pos),
            100.0 * accepted / max(draft_tokens, 1),
        )


class PrometheusStatLogger:
    """Prometheus metrics of one engine, in their own registry (see `render`).

    Args:
        model_name: the served model name (label `model_name`).
        max_model_len: upper bound of the token-count histograms.
        config_labels: labels of the info-style `cache_config_info` gauge.
    """

    def __init__(
        self, model_name: str, max_model_len: int, config_labels: dict[str, str] | None = None
    ) -> None:
        # The `*_created` series double the output and no vLLM dashboard reads them.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self._labels = {"model_name": model_name, "engine": "0"}
        self._last_cumulative: dict[str, float] = {}
        self._last_recorded: Any = None  # the stats record_scheduler saw last
        self._make_scheduler_metrics(config_labels or {})
        self._make_request_metrics(build_1_2_5_buckets(max_model_len))

    def _metric(self, kind: type, name: str, doc: str, **kwargs: Any) -> Any:
        labelnames = list(self._labels) + kwargs.pop("extra_labels", [])
        return kind(PREFIX + name, doc, labelnames, registry=self.registry, **kwargs)

    def _make_scheduler_metrics(self, config_labels: dict[str, str]) -> None:
        m, labels = self._metric, self._labels
        self.running = m(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = m(Gauge, "num_requests_waiting", "Requests waiting for admission.")
        self.kv_usage = m(Gauge, "kv_cache_usage_perc", "KV cache usage (1 = 100%).")
        self.swapped = m(Gauge, "num_requests_swapped", "Requests swapped out to the host.")
        self.cpu_kv_usage = m(
            Gauge, "cpu_kv_cache_usage_perc", "Host swap space usage (1 = 100%)."
        )
        self.encoder_usage = m(
            Gauge, "encoder_cache_usage_perc",
            "Encoder cache held by images requests still need (1 = 100%).",
        )
        self.preemptions = m(Counter, "num_preemptions", "Cumulative preemptions.")
        self.prefix_queries = m(
            Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = m(Counter, "prefix_cache_hits", "Prompt tokens found cached.")
        self.model_execute = m(
            Counter,
            "model_execute_seconds",
            "Seconds the model runner spent executing steps (its busy time).",
        )
        self.spec_drafts = m(
            Counter, "spec_decode_num_drafts", "Verifications of draft tokens (per request)."
        )
        self.spec_draft_tokens = m(
            Counter, "spec_decode_num_draft_tokens", "Draft tokens verified."
        )
        self.spec_accepted = m(
            Counter, "spec_decode_num_accepted_tokens", "Draft tokens accepted."
        )
        self.kv_transfer_bytes = m(
            Counter, "kv_transfer_bytes", "Bytes a KV connector moved (sent: saved or sent to "
            "a peer; received: loaded).", extra_labels=["direction"])
        self.kv_transfer_seconds = m(
            Histogram, "kv_transfer_seconds", "Seconds of each KV connector transfer (a "
            "step's loads, or its saves).",
            buckets=[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0])
        self.kv_transfer_failures = m(
            Counter, "kv_transfer_failures", "KV blocks that failed to load.")
        for direction in ("sent", "received"):  # shown at 0 before any traffic
            self.kv_transfer_bytes.labels(**labels, direction=direction)
        self.kv_transfer_failures.labels(**labels)
        self.kv_transfer_seconds.labels(**labels)
        self.spec_accepted_per_pos = m(
            Counter,
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft.",
            extra_labels=["position"],
        )
        for gauge in (self.running, self.waiting, self.kv_usage, self.swapped, self.cpu_kv_usage):
            gauge.labels(**labels).set(0)
        for counter in (
            self.preemptions, self.prefix_queries, self.prefix_hits, self.model_execute,
            self.spec_drafts, self.spec_draft_tokens, self.spec_accepted,
        ):
            counter.labels(**labels)
        info = Gauge(
            PREFIX + "cache_config_info",
            "Cache configuration.",
            list(config_labels),
            registry=self.registry,
        )
        (info.labels(**config_labels) if config_labels else info).set(1)

    def _make_request_metrics(self, token_buckets: list[int]) -> None:
        m, labels = self._metric, self._labels
        self.prompt_tokens = m(Counter, "prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = m(Counter, "generation_tokens", "Generated tokens.")
        self.success = m(
            Counter,
            "request_success",
            "Finished requests by finish reason.",
            extra_labels=["finished_reason"],
        )
        for reason in FINISH_REASONS:
            self.success.labels(**labels, finished_reason=reason)
        self.ttft = m(
            Histogram, "time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS
        )
        self.itl = m(
            Histogram, "inter_token_latency_seconds", "Inter-token latency.", buckets=ITL_BUCKETS
        )
        self.tpot = m(
            Histogram,
            "request_time_per_output_token_seconds",
            "Mean time per output token of each request.",
            buckets=ITL_BUCKETS,
        )
        self.e2e = m(
            Histogram,
            "e2e_request_latency_seconds",
            "End-to-end request latency.",
            buckets=LATENCY_BUCKETS,
        )
        self.request_prompt = m(
            Histogram, "request_prompt_tokens", "Prompt tokens per request.", buckets=token_buckets
        )
        self.request_generation = m(
            Histogram,
            "request_generation_tokens",
            "Generated tokens per request.",
            buckets=token_buckets,
        )
        for name, doc in (
            ("request_queue_time_seconds", "Arrival to first scheduled."),
            ("request_prefill_time_seconds", "First scheduled to first token."),
            ("request_decode_time_seconds", "First token to last token."),
            ("request_inference_time_seconds", "First scheduled to last token."),
        ):
            setattr(self, name, m(Histogram, name, doc, buckets=LATENCY_BUCKETS))
        self.max_generation = m(
            Histogram,
            "request_max_num_generation_tokens",
            "Most tokens generated by one sequence of a request.",
            buckets=token_buckets,
        )
        self.params_n = m(
            Histogram, "request_params_n", "The n request parameter.", buckets=[1, 2, 5, 10, 20]
        )
        self.params_max_tokens = m(
            Histogram,
            "request_params_max_tokens",
            "The max_tokens request parameter.",
            buckets=token_buckets,
        )

    def record_scheduler(self, stats: Any) -> None:
        """Gauges and cumulative counters from a `SchedulerStats`."""
        labels = self._labels
        self.running.labels(**labels).set(stats.num_running_reqs)
        self.waiting.labels(**labels).set(stats.num_waiting_reqs)
        self.kv_usage.labels(**labels).set(stats.kv_cache_usage)
        self.swapped.labels(**labels).set(stats.num_swapped_reqs)
        self.cpu_kv_usage.labels(**labels).set(getattr(stats, "cpu_kv_cache_usage", 0.0))
        self.encoder_usage.labels(**labels).set(getattr(stats, "encoder_cache_usage", 0.0))
        for name, counter in (
            ("num_preemptions", self.preemptions),
            ("prefix_cache_queries", self.prefix_queries),
            ("prefix_cache_hits", self.prefix_hits),
            ("model_execute_seconds", self.model_execute),
            ("spec_num_drafts", self.spec_drafts),
            ("spec_num_draft_tokens", self.spec_draft_tokens),
            ("spec_num_accepted_tokens", self.spec_accepted),
        ):
            self._add_delta(counter, name, float(getattr(stats, name, 0) or 0))
        self._add_delta(self.kv_transfer_failures, "kv_transfer_failures",
                        float(getattr(stats, "kv_transfer_failures", 0) or 0))
        for direction in ("sent", "received"):
            name = f"kv_transfer_bytes_{direction}"
            value = float(getattr(stats, name, 0) or 0)
            delta = value - self._last_cumulative.get(name, 0)
            if delta > 0:
                self.kv_transfer_bytes.labels(**self._labels, direction=direction).inc(delta)
            self._last_cumulative[name] = value
        if stats is not self._last_recorded:  # one step's samples are observed once
            for seconds in getattr(stats, "kv_transfer_seconds", None) or []:
                self.kv_transfer_seconds.labels(**self._labels).observe(seconds)
        self._last_recorded = stats
        per_pos = getattr(stats, "spec_accepted_per_pos", None) or []
        for position, value in enumerate(per_pos):
            counter = self.spec_accepted_per_pos
            self._add_delta(counter, f"spec_pos_{position}", float(value), str(position))

    def _add_delta(
        self, counter: Any, name: str, value: float, position: str | None = None
    ) -> None:
        """Increase `counter` by how much the cumulative `value` grew since last time."""
        delta = value - self._last_cumulative.get(name, 0)
        labels = dict(self._labels) if position is None else {**self._labels, "position": position}
        if delta > 0:
            counter.labels(**labels).inc(delta)
        self._last_cumulative[name] = value

    def record_iteration(self, sample: IterationSample) -> None:
        """Token counters, TTFT and inter-token latency of one batch."""
        labels = self._labels
        if sample.num_prompt_tokens:
            self.prompt_tokens.labels(**labels).inc(sample.num_prompt_tokens)
        if sample.num_generation_tokens:
            self.generation_tokens.labels(**labels).inc(sample.num_generation_tokens)
        for value in sample.time_to_first_tokens:
            self.ttft.labels(**labels).observe(value)
        for value in sample.inter_token_latencies:
            self.itl.labels(**labels).observe(value)

    def record_finished(self, sample: FinishedRequestSample) -> None:
        """Per-request histograms and the success counter."""
        labels = self._labels
        self.success.labels(**labels, finished_reason=sample.finish_reason).inc()
        self.e2e.labels(**labels).observe(sample.e2e_latency)
        self.request_prompt.labels(**labels).observe(sample.num_prompt_tokens)
        self.request_generation.labels(**labels).observe(sample.num_generation_tokens)
        self.params_n.labels(**labels).observe(sample.n)
        if sample.max_tokens is not None:
            self.params_max_tokens.labels(**labels).observe(sample.max_tokens)
        if sample.time_per_output_token is not None:
            self.tpot.labels(**labels).observe(sample.time_per_output_token)
        for name, value in (
            ("request_queue_time_seconds", sample.queue_time),
            ("request_prefill_time_seconds", sample.prefill_time),
            ("request_decode_time_seconds", sample.decode_time),
            ("request_inference_time_seconds", sample.inference_time),
        ):
            if value is not None:
                getattr(self, name).labels(**labels).observe(value)
        self.max_generation.labels(**labels).observe(sample.max_num_generation_tokens)

    def dashboard_view(self) -> dict[str, Any]:
        """What the live dashboard plots: token totals (it takes rates between polls),
        finished requests by reason, and the TTFT and inter-token latency histograms."""
        return {
            "prompt_tokens_total": _total(self.prompt_tokens),
            "generation_tokens_total": _total(self.generation_tokens),
            "finished": {reason: _total(self.success, finished_reason=reason)
                         for reason in FINISH_REASONS},
            "ttft": _histogram(self.ttft),
            "itl": _histogram(self.itl),
        }

    def render(self) -> bytes:
        """The registry in Prometheus text format: the `pagedllm:` metrics, then the same
        under vLLM's names."""
        return generate_latest(self.registry) + generate_latest(self._vllm_names)

    @property
    def _vllm_names(self) -> CollectorRegistry:
        registry = getattr(self, "_vllm_registry", None)
        if registry is None:
            registry = CollectorRegistry()
            registry.register(VllmNames(self.registry))
            self._vllm_registry = registry
        return registry


class VllmNames:
    """A collector of every `pagedllm:` metric of `source` again under vLLM's names (the same
    samples, renamed), plus vLLM's older names (VLLM_LEGACY_NAMES)."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        """The renamed families (prometheus_client's collector protocol)."""
        legacy_of: dict[str, list[str]] = {}
        for old, new in VLLM_LEGACY_NAMES.items():
            legacy_of.setdefault(new, []).append(old)
        for family in self.source.collect():
            if not family.name.startswith(PREFIX):
                continue
            short = family.name[len(PREFIX):]
            for name in (short, *legacy_of.get(short, [])):
                yield _renamed(family, PREFIX + short, VLLM_PREFIX + name)


def _total(counter: Any, **labels: str) -> float:
    """A counter's value summed over the label sets matching `labels`."""
    return sum(
        sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
        and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _histogram(histogram: Any) -> dict[str, Any]:
    """A histogram as upper bounds, per-bucket (not cumulative) counts, count and sum."""
    bounds: list[float] = []
    cumulative: list[float] = []
    count = total = 0.0
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bounds.append(float(sample.labels["le"]))
                cumulative.append(sample.value)
            elif sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
    counts = [c - (cumulative[i - 1] if i else 0.0) for i, c in enumerate(cumulative)]
    return {"bounds": [b if b != float("inf") else None for b in bounds], "counts": counts,
            "count": count, "sum": total}


def _renamed(family: Metric, old: str, new: str) -> Metric:
    """`family` with its name (and its samples' names) `old...` made `new...`."""
    copy = Metric(new, family.documentation, family.type, family.unit)
    for sample in family.samples:
        copy.add_sample(new + sample.name[len(old):], sample.labels, sample.value,
                        sample.timestamp, sample.exemplar)
    return copy
