"""Per-request timings measured in the frontend: TTFT, inter-token latency, end-to-end latency.

The frontend sees each step's new tokens the moment they arrive, so it measures what a client
experiences (TTFT counts from arrival, tokenization included). This module only measures; the
stat loggers in `loggers.py` export the samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class RequestTiming:
    """Timestamps (time.monotonic) and counts of one live user request."""

    arrival_time: float
    num_prompt_tokens: int
    n: int
    max_tokens: int | None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_generation_tokens: int = 0
    # When the engine core first scheduled it (same clock; from the core's first output).
    first_scheduled_time: float | None = None
    # Tokens of each of its sequences (core request id -> count).
    sequence_tokens: dict[str, int] = field(default_factory=dict)


@dataclass
class IterationSample:
    """What one batch of core outputs meant to the users."""

    num_prompt_tokens: int = 0  # prompts whose first token arrived in this batch
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class FinishedRequestSample:
    """One finished (or aborted) request."""

    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    time_per_output_token: float | None
    n: int
    max_tokens: int | None
    # vLLM's intervals: queue = arrival -> first scheduled, prefill = first scheduled -> first
    # token, decode = first -> last token, inference = first scheduled -> last token (None
    # when the request never got that far).
    queue_time: float | None = None
    prefill_time: float | None = None
    decode_time: float | None = None
    inference_time: float | None = None
    max_num_generation_tokens: int = 0


class RequestTimingTracker:
    """Keeps a `RequestTiming` per live request and turns events into samples."""

    def __init__(self) -> None:
        self._timings: dict[str, RequestTiming] = {}

    def add_request(
        self,
        request_id: str,
        arrival_time: float,
        num_prompt_tokens: int,
        n: int,
        max_tokens: int | None,
    ) -> None:
        """Start timing a request that was just accepted."""
        self._timings[request_id] = RequestTiming(arrival_time, num_prompt_tokens, n, max_tokens)

    def observe_scheduled(self, request_id: str, first_scheduled_time: float) -> None:
        """Note when the core first scheduled the request (in this tracker's clock)."""
        timing = self._timings.get(request_id)
        if timing is not None and timing.first_scheduled_time is None:
            timing.first_scheduled_time = first_scheduled_time

    def observe_tokens(
        self, new_tokens: Iterable[tuple[str, str, int]], now: float
    ) -> IterationSample:
        """Record one batch: (request_id, sequence id, number of new tokens) triples, at time
        `now`. A request with several sequences (n > 1) counts one latency sample per batch.
        """
        sample = IterationSample()
        seen: set[str] = set()
        for request_id, sequence_id, num_tokens in new_tokens:
            timing = self._timings.get(request_id)
            if timing is None:
                continue
            sample.num_generation_tokens += num_tokens
            timing.num_generation_tokens += num_tokens
            counts = timing.sequence_tokens
            counts[sequence_id] = counts.get(sequence_id, 0) + num_tokens
            if num_tokens == 0 or request_id in seen:
                continue
            seen.add(request_id)
            if timing.first_token_time is None:
                timing.first_token_time = now
                sample.num_prompt_tokens += timing.num_prompt_tokens
                sample.time_to_first_tokens.append(now - timing.arrival_time)
            elif timing.last_token_time is not None:
                sample.inter_token_latencies.append(now - timing.last_token_time)
            timing.last_token_time = now
        return sample

    def finish_request(
        self, request_id: str, finish_reason: str, now: float
    ) -> FinishedRequestSample | None:
        """Stop timing a request; None if it was not tracked (or already finished)."""
        timing = self._timings.pop(request_id, None)
        if timing is None:
            return None
        tpot = None
        per_sequence = timing.num_generation_tokens / max(timing.n, 1)
        first, last = timing.first_token_time, timing.last_token_time
        if first is not None and last is not None and per_sequence > 1:
            tpot = (last - first) / (per_sequence - 1)
        scheduled = timing.first_scheduled_time
        return FinishedRequestSample(
            finish_reason=finish_reason,
            e2e_latency=now - timing.arrival_time,
            num_prompt_tokens=timing.num_prompt_tokens,
            num_generation_tokens=timing.num_generation_tokens,
            time_per_output_token=tpot,
            n=timing.n,
            max_tokens=timing.max_tokens,
            queue_time=_interval(timing.arrival_time, scheduled),
            prefill_time=_interval(scheduled, first),
            decode_time=_interval(first, last),
            inference_time=_interval(scheduled, last),
            max_num_generation_tokens=max(timing.sequence_tokens.values(), default=0),
        )

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._timings


def _interval(start: float | None, end: float | None) -> float | None:
    """end - start (never negative: the core's clock is converted), None if either is."""
    return None if start is None or end is None else max(0.0, end - start)
