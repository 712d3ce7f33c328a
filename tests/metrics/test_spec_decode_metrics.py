"""Speculative decoding's counters in the Prometheus exporter, the log line and the offline
metrics records."""

from __future__ import annotations

import logging

from pagedllm.metrics.loggers import LoggingStatLogger, PrometheusStatLogger
from pagedllm.metrics.reader import Counter, Vector, metrics_from_stats
from pagedllm.metrics.stats import SchedulerStats
from tests.entrypoints.openai.conftest import metric


def _stats(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> SchedulerStats:
    return SchedulerStats(
        spec_num_drafts=drafts,
        spec_num_draft_tokens=draft_tokens,
        spec_num_accepted_tokens=accepted,
        spec_accepted_per_pos=per_pos,
    )


def test_prometheus_counters_follow_the_cumulative_stats():
    logger = PrometheusStatLogger("m", 64, {"block_size": "16"})
    logger.record_scheduler(_stats(2, 6, 3, [2, 1, 0]))
    logger.record_scheduler(_stats(5, 15, 9, [5, 3, 1]))
    text = logger.render().decode()
    assert metric(text, "pagedllm:spec_decode_num_drafts_total") == 5
    assert metric(text, "pagedllm:spec_decode_num_draft_tokens_total") == 15
    assert metric(text, "pagedllm:spec_decode_num_accepted_tokens_total") == 9
    per_pos = "pagedllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [metric(text, per_pos, position=str(p)) for p in range(3)] == [5, 3, 1]


def test_log_line_gives_the_mean_acceptance_length(caplog):
    logger = LoggingStatLogger(interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="pagedllm.metrics.loggers"):
        logger.record(_stats(4, 12, 6, [3, 2, 1]), None)
        logger.record(_stats(8, 24, 14, [7, 5, 2]), None)
    lines = [r.getMessage() for r in caplog.records if "SpecDecoding" in r.getMessage()]
    assert len(lines) == 2
    assert "Mean acceptance length: 2.50" in lines[0]
    # The second line covers the second interval only: 4 drafts, 8 of 12 accepted.
    assert "Mean acceptance length: 3.00" in lines[1]
    assert "Per-position acceptance rate: 1.000, 0.750, 0.250" in lines[1]


def test_offline_records():
    records = {m.name: m for m in metrics_from_stats(_stats(3, 9, 4, [3, 1, 0]))}
    drafts = records["pagedllm:spec_decode_num_drafts"]
    assert isinstance(drafts, Counter) and drafts.value == 3
    per_pos = records["pagedllm:spec_decode_num_accepted_tokens_per_pos"]
    assert isinstance(per_pos, Vector) and per_pos.values == [3, 1, 0]
    assert metrics_from_stats(None) == []
