"""Plain-data pictures of the scheduler: its counters after every step (`SchedulerStats`,
for the metrics) and, for the live dashboard, each KV block's state and each request's
progress (built between steps by a utility call, read by the API server)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pagedllm.core.block_pool import NULL_BLOCK_ID, BlockPool
from pagedllm.metrics.stats import SchedulerStats
from pagedllm.request import Request

if TYPE_CHECKING:
    from pagedllm.core.scheduler import Scheduler

# One character per usable KV block: held by a request, free but still findable by its
# hash (a prefix-cache entry), or free and empty.
BLOCK_USED, BLOCK_CACHED, BLOCK_FREE = "u", "c", "f"
# Requests listed one by one (running first); the counts cover all of them.
MAX_LISTED_REQUESTS = 64


def scheduler_stats(scheduler: Scheduler) -> SchedulerStats:
    """The scheduler's state and cumulative counters after a step."""
    manager, counters = scheduler.kv_cache_manager, scheduler.spec_counters
    return SchedulerStats(
        num_running_reqs=scheduler.num_running,
        num_waiting_reqs=scheduler.num_waiting + len(scheduler.pooling),
        num_swapped_reqs=scheduler.num_swapped,
        kv_cache_usage=manager.usage,
        cpu_kv_cache_usage=scheduler.swap_manager.usage,
        encoder_cache_usage=scheduler.encoder.cache.usage,
        prefix_cache_queries=manager.prefix_cache_queries,
        prefix_cache_hits=manager.prefix_cache_hits,
        num_preemptions=scheduler.num_preemptions,
        num_computed_prompt_tokens=scheduler.num_computed_prompt_tokens,
        spec_num_drafts=counters.num_drafts,
        spec_num_draft_tokens=counters.num_draft_tokens,
        spec_num_accepted_tokens=counters.num_accepted_tokens,
        spec_accepted_per_pos=list(counters.accepted_per_pos),
    )


def block_states(pool: BlockPool) -> str:
    """The state of every usable block, in block-id order."""
    return "".join(
        BLOCK_USED if block.ref_cnt > 0
        else BLOCK_CACHED if block.block_hash is not None
        else BLOCK_FREE
        for block in pool.blocks[NULL_BLOCK_ID + 1 :]
    )


def request_progress(request: Request, state: str, now: float) -> dict[str, Any]:
    """What the dashboard shows of one request."""
    return {
        "id": request.request_id,
        "state": state,
        "prompt_tokens": request.num_prompt_tokens,
        "computed_tokens": min(request.num_computed_tokens, request.num_tokens),
        "output_tokens": request.num_output_tokens,
        "max_tokens": request.max_tokens if not request.is_pooling else 0,
        "age_s": round(max(0.0, now - request.arrival_time), 3),
    }


def scheduler_snapshot(scheduler: Scheduler) -> dict[str, Any]:
    """Counts, the block map and the listed requests' progress."""
    now = time.time()
    listed: list[dict[str, Any]] = []
    remote_kv = scheduler.remote_kv  # parked while a KV connector loads, or loaded
    for state, requests in (("running", scheduler.running), ("swapped", scheduler.swapped),
                            ("waiting", scheduler.waiting),
                            ("waiting_for_remote_kvs", [*remote_kv.loading.values(),
                                                        *remote_kv])):
        for request in requests:
            if len(listed) == MAX_LISTED_REQUESTS:
                break
            listed.append(request_progress(request, state, now))
    manager = scheduler.kv_cache_manager if scheduler.has_kv_cache else None
    return {
        "num_running": len(scheduler.running),
        "num_waiting": scheduler.num_waiting,
        "num_swapped": len(scheduler.swapped),
        "block_size": manager.block_size if manager is not None else 0,
        "blocks": block_states(manager.block_pool) if manager is not None else "",
        "requests": listed,
    }
