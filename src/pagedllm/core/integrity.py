"""The scheduler's invariants, asserted after every step by the tests (and on demand):
every request in exactly one queue, no request lost, blocks held only by running ones, each
running request's tables long enough for what it computed, swapped ones' host blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedllm.request import RequestStatus

if TYPE_CHECKING:
    from pagedllm.core.scheduler import Scheduler


def check_scheduler_integrity(scheduler: Scheduler) -> None:
    """Assert the scheduler's, the KV cache's and the swap space's invariants."""
    scheduler.kv_cache_manager.check_integrity()
    scheduler.swap_manager.check_integrity()
    queues = {
        RequestStatus.RUNNING: [r.request_id for r in scheduler.running],
        RequestStatus.WAITING: [r.request_id for r in scheduler.waiting],
        RequestStatus.SWAPPED: [r.request_id for r in scheduler.swapped],
        # Parked while a KV connector loads their KV, or loaded and not yet admitted.
        RequestStatus.WAITING_FOR_REMOTE_KVS: [
            *scheduler.remote_kv.loading, *(r.request_id for r in scheduler.remote_kv)],
    }
    pooling = [r.request_id for r in (*scheduler.pooling, *scheduler.pooling.in_step)]
    all_ids = [request_id for ids in queues.values() for request_id in ids] + pooling
    assert len(set(all_ids)) == len(all_ids), "a request is queued twice"
    assert set(all_ids) == set(scheduler.requests), "a request is lost"
    assert len(scheduler.running) <= scheduler.scheduler_config.max_num_seqs
    in_step = {r.request_id for r in scheduler.pooling.in_step}
    holders = (set(queues[RequestStatus.RUNNING]) | in_step
               | set(queues[RequestStatus.WAITING_FOR_REMOTE_KVS]) | set(scheduler.kv_sending))
    assert scheduler.kv_cache_manager.get_request_ids() <= holders, (
        "a request that is not running holds KV blocks"
    )
    assert not set(scheduler.kv_sending) & set(scheduler.requests), "a held request runs"
    for request in scheduler.kv_sending.values():
        assert request.is_finished()
    assert scheduler.swap_manager.get_request_ids() == set(queues[RequestStatus.SWAPPED])
    _check_request_states(scheduler)


def _check_request_states(scheduler: Scheduler) -> None:
    block_size = scheduler.cache_config.block_size
    manager = scheduler.kv_cache_manager
    for request in scheduler.running:
        assert request.status == RequestStatus.RUNNING
        # Between schedule() and update_from_output() drafts count as computed.
        num_known = request.num_tokens + len(request.spec_token_ids)
        assert 0 <= request.num_computed_tokens <= num_known
        assert request.num_computed_tokens <= scheduler.max_model_len
        for table in manager.get_block_ids(request.request_id):
            assert len(table) * block_size >= request.num_computed_tokens
    for request in scheduler.waiting:
        assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert request.num_computed_tokens == 0
    for request in (*scheduler.remote_kv.loading.values(), *scheduler.remote_kv):
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        for table in manager.get_block_ids(request.request_id):
            assert len(table) * block_size >= request.num_computed_tokens
    for request in scheduler.swapped:
        assert request.status == RequestStatus.SWAPPED
        num_host_blocks = scheduler.swap_manager.get_num_host_blocks(request.request_id)
        num_held = manager.get_num_blocks_held(request.num_computed_tokens)
        assert num_host_blocks == num_held > 0
