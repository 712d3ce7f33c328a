"""vLLM's per-request intervals from the frontend's timings: queue (arrival -> first
scheduled), prefill (-> first token), decode (first -> last token), inference (scheduled ->
last token), the longest sequence of an n > 1 request; exported as Prometheus histograms
under both names, the swap gauges included."""

from __future__ import annotations

import pytest

from pagedllm.metrics.loggers import PrometheusStatLogger
from pagedllm.metrics.request_timing import RequestTimingTracker
from pagedllm.metrics.stats import SchedulerStats
from tests.entrypoints.openai.conftest import metric


def test_intervals_of_a_two_sequence_request():
    tracker = RequestTimingTracker()
    tracker.add_request("r", arrival_time=10.0, num_prompt_tokens=7, n=2, max_tokens=9)
    tracker.observe_scheduled("r", 10.5)
    tracker.observe_scheduled("r", 99.0)  # only the first counts
    tracker.observe_tokens([("r", "0_r", 1), ("r", "1_r", 1)], now=11.0)
    tracker.observe_tokens([("r", "0_r", 3), ("r", "1_r", 1)], now=12.5)
    sample = tracker.finish_request("r", "length", now=13.0)
    assert sample is not None
    assert sample.queue_time == pytest.approx(0.5)
    assert sample.prefill_time == pytest.approx(0.5)
    assert sample.decode_time == pytest.approx(1.5)
    assert sample.inference_time == pytest.approx(2.0)
    assert sample.max_num_generation_tokens == 4 and sample.num_generation_tokens == 6

    logger = PrometheusStatLogger("m", 64)
    logger.record_finished(sample)
    logger.record_scheduler(SchedulerStats(num_swapped_reqs=2, cpu_kv_cache_usage=0.25))
    text = logger.render().decode()
    for prefix in ("pagedllm:", "vllm:"):
        assert metric(text, prefix + "request_queue_time_seconds_sum") == pytest.approx(0.5)
        assert metric(text, prefix + "request_decode_time_seconds_count") == 1
        assert metric(text, prefix + "request_max_num_generation_tokens_sum") == 4
        assert metric(text, prefix + "num_requests_swapped") == 2
    assert metric(text, "vllm:cpu_cache_usage_perc") == 0.25


def test_a_request_aborted_before_scheduling_has_no_intervals():
    tracker = RequestTimingTracker()
    tracker.add_request("r", arrival_time=1.0, num_prompt_tokens=3, n=1, max_tokens=None)
    sample = tracker.finish_request("r", "abort", now=2.0)
    assert sample is not None and sample.queue_time is None and sample.decode_time is None
    assert sample.max_num_generation_tokens == 0
