"""Stats records the engine produces: plain dataclasses, no logic beyond derived ratios.

`SchedulerStats` is a snapshot the scheduler makes each step; the engine core sends it to
the frontend in `EngineCoreOutputs.scheduler_stats` (msgspec encodes dataclasses), where
log lines and the Prometheus exporter read it. Counters named "cumulative" only grow over
the engine's life, so an exporter turns them into Prometheus counters by taking deltas.
This module must not import torch or anything from the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SchedulerStats:
    """The scheduler's state after one step.

    Attributes:
        num_running_reqs: requests in the running batch.
        num_waiting_reqs: requests waiting for admission (new or preempted by recompute).
        num_swapped_reqs: requests preempted to the host swap space.
        kv_cache_usage: share of usable KV blocks in use, in [0, 1].
        cpu_kv_cache_usage: share of the host swap pool in use, in [0, 1] (swap preemption).
        encoder_cache_usage: share of the encoder cache held by items some request still
            needs, in [0, 1] (vision-language models; unused entries kept for reuse are
            free space).
        prefix_cache_queries: cumulative prompt tokens looked up in the prefix cache.
        prefix_cache_hits: cumulative tokens of those found cached.
        num_preemptions: cumulative preemptions (swap and recompute).
        num_computed_prompt_tokens: cumulative prompt tokens the model ran (recomputed ones
            included, prefix-cache hits excluded).
        model_execute_seconds: cumulative seconds the model runner spent executing steps
            (filled in by the engine core; its share of wall time is the runner's busy share).
        spec_num_drafts: cumulative verifications of draft tokens (speculative decoding).
        spec_num_draft_tokens: cumulative draft tokens verified.
        spec_num_accepted_tokens: cumulative draft tokens accepted.
        spec_accepted_per_pos: cumulative acceptances per draft position.
        kv_transfer_bytes_received / kv_transfer_bytes_sent: cumulative bytes a KV
            connector loaded / saved (distributed/kv_transfer/).
        kv_transfer_failures: cumulative blocks that failed to load.
        kv_transfer_seconds: this step's transfers' durations (one per load or save batch).
    """

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_swapped_reqs: int = 0
    kv_cache_usage: float = 0.0
    cpu_kv_cache_usage: float = 0.0
    encoder_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_computed_prompt_tokens: int = 0
    model_execute_seconds: float = 0.0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    kv_transfer_bytes_received: int = 0
    kv_transfer_bytes_sent: int = 0
    kv_transfer_failures: int = 0
    kv_transfer_seconds: list[float] = field(default_factory=list)

    @property
    def spec_mean_acceptance_length(self) -> float:
        """Tokens emitted per verification: 1 + accepted drafts per draft (0 before any)."""
        if self.spec_num_drafts == 0:
            return 0.0
        return 1.0 + self.spec_num_accepted_tokens / self.spec_num_drafts

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cumulative hits / queries, 0 before any query."""
        if self.prefix_cache_queries == 0:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries


@dataclass
class KVTransferCounts:
    """One step's KV connector traffic (worker → engine core)."""

    bytes_received: int = 0
    bytes_sent: int = 0
    failures: int = 0
    seconds: list[float] = field(default_factory=list)

    def add(self, other: KVTransferCounts) -> None:
        """Fold `other`'s traffic into this one."""
        self.bytes_received += other.bytes_received
        self.bytes_sent += other.bytes_sent
        self.failures += other.failures
        self.seconds.extend(other.seconds)


def merge_scheduler_stats(parts: list[SchedulerStats]) -> SchedulerStats:
    """Several engine cores' stats as one engine's (data parallel): counts and cumulative
    counters summed, KV cache usage averaged (the cores' caches are the same size)."""
    merged = SchedulerStats()
    for stats in parts:
        for name in ("num_running_reqs", "num_waiting_reqs", "num_swapped_reqs",
                     "prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
                     "num_computed_prompt_tokens", "model_execute_seconds", "spec_num_drafts",
                     "spec_num_draft_tokens", "spec_num_accepted_tokens",
                     "kv_transfer_bytes_received", "kv_transfer_bytes_sent",
                     "kv_transfer_failures"):
            setattr(merged, name, getattr(merged, name) + getattr(stats, name))
        per_pos = merged.spec_accepted_per_pos
        for position, count in enumerate(stats.spec_accepted_per_pos):
            if position < len(per_pos):
                per_pos[position] += count
            else:
                per_pos.append(count)
    if parts:
        merged.kv_cache_usage = sum(s.kv_cache_usage for s in parts) / len(parts)
        merged.cpu_kv_cache_usage = sum(s.cpu_kv_cache_usage for s in parts) / len(parts)
    return merged
