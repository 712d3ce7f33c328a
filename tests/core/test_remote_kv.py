"""Asynchronous KV loads in the scheduler (core/remote_kv.py): a parked request holds its
blocks but no seat, budget or prefix-cache entry while its KV loads, and the requests
behind it run meanwhile; once loaded it runs from its loaded tokens; a failed load fails it
or has it compute its prompt itself; a finished request whose blocks a peer pulls holds
them until the worker says they were pulled. test_scheduler_random.py drives the same
paths with random workloads."""

from __future__ import annotations

from pagedllm.core.snapshot import scheduler_snapshot
from pagedllm.distributed.kv_transfer.base import KVConnectorOutput
from pagedllm.request import Request, RequestData, RequestStatus
from pagedllm.sampling_params import SamplingParams
from tests.core.test_scheduler import make_request, make_scheduler, model_output
from tests.core.test_scheduler_random import FakeAsyncConnector


def _setup(policy="fail", **kwargs):
    scheduler = make_scheduler(max_num_seqs=1, block_size=4, enable_prefix_caching=True,
                               **kwargs)
    connector = FakeAsyncConnector({"remote"}, {"held"}, policy)
    scheduler.kv_connector = connector
    return scheduler, connector


def _step(scheduler, news=None):
    output = scheduler.schedule()
    runner_output = model_output(scheduler, output)
    runner_output.kv_connector_output = news
    scheduler.update_from_output(output, runner_output)
    scheduler.check_integrity()
    return output


def test_a_parked_request_holds_back_nobody_and_runs_once_loaded():
    scheduler, connector = _setup()
    scheduler.add_request(make_request("remote", 10))
    scheduler.add_request(Request("local", RequestData([50 + i for i in range(6)],
                                                       SamplingParams(max_tokens=4))))
    output = _step(scheduler)
    # The remote request is parked (9 tokens to load into 3 blocks): the local one runs
    # in the one seat, in the same step.
    assert list(output.num_scheduled_tokens) == ["local"]
    (load,) = output.kv_connector_metadata
    assert load[0] == "remote" and (load[2], load[3]) == (0, 9) and len(load[1]) == 3
    remote = scheduler.requests["remote"]
    assert remote.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert remote.num_computed_tokens == 9 and scheduler.has_pending_kv_transfers()
    # It counts as waiting (metrics, the dashboard), listed in its own state.
    assert scheduler.make_stats().num_waiting_reqs == 1
    snapshot = scheduler_snapshot(scheduler)
    assert snapshot["num_waiting"] == 1
    assert [(r["id"], r["state"]) for r in snapshot["requests"]] == [
        ("local", "running"), ("remote", "waiting_for_remote_kvs")]
    # Its blocks are not in the prefix cache while their KV is missing.
    probe = make_request("probe", 10)
    assert scheduler.kv_cache_manager.get_computed_blocks(probe)[1] == 0
    _step(scheduler, KVConnectorOutput(finished_recving={"remote"}))
    scheduler.finish_requests("local", RequestStatus.FINISHED_ABORTED)
    output = _step(scheduler)
    assert output.num_scheduled_tokens == {"remote": 1}  # only its last prompt token
    assert output.scheduled_new_reqs[0].num_computed_tokens == 9
    # Now the loaded blocks are findable.
    assert scheduler.kv_cache_manager.get_computed_blocks(probe)[1] == 8
    assert not scheduler.has_pending_kv_transfers()


def test_a_failed_load_fails_the_request_or_it_computes_the_prompt():
    for policy, status, scheduled in (("fail", RequestStatus.FINISHED_ERROR, None),
                                      ("recompute", RequestStatus.RUNNING, 10)):
        scheduler, _ = _setup(policy)
        request = make_request("remote", 10)
        scheduler.add_request(request)
        _step(scheduler)
        _step(scheduler, KVConnectorOutput(failed_recving={"remote"}))
        if scheduled is None:
            assert request.status == status and scheduler.kv_cache_usage == 0.0
            assert "remote" not in scheduler.requests
            continue
        output = _step(scheduler)
        assert output.num_scheduled_tokens == {"remote": scheduled}  # all of it, here
        assert request.status == status and request.num_cached_tokens == 0


def test_an_aborted_parked_request_frees_its_blocks():
    scheduler, _ = _setup()
    scheduler.add_request(make_request("remote", 10))
    _step(scheduler)
    assert scheduler.kv_cache_usage > 0
    scheduler.abort_requests("remote")
    scheduler.check_integrity()
    assert scheduler.kv_cache_usage == 0.0 and not scheduler.has_pending_kv_transfers()
    _step(scheduler, KVConnectorOutput(finished_recving={"remote"}))  # late news: ignored


def test_held_blocks_stay_until_pulled():
    scheduler, connector = _setup()
    scheduler.add_request(make_request("held", 6, max_tokens=1))
    _step(scheduler)
    assert "held" not in scheduler.requests and "held" in scheduler.kv_sending
    assert scheduler.kv_cache_usage > 0 and scheduler.has_pending_kv_transfers()
    _step(scheduler)  # an empty step: still held
    assert scheduler.kv_cache_usage > 0
    _step(scheduler, KVConnectorOutput(finished_sending={"held"}))
    assert scheduler.kv_cache_usage == 0.0 and not scheduler.kv_sending
