"""Random workloads through the scheduler and a fake worker that simulates the KV cache.

Hypothesis draws arrivals, prompt lengths, shared prefixes, priorities, aborts (between
steps and between schedule and update), token budgets, sequence caps, block counts, prefix
caching on/off, swap or recompute preemption with a random host pool, and the FCFS or
priority policy, and the KV cache groups (one full-attention group, one sliding-window
group, or a hybrid of both, as Gemma 3 has). After every step it checks: no block is both
free and used; reference counts equal the number of holders; the token budget and sequence
cap hold; and the KV that every scheduled request attends to is exactly its own prefix. The
fake worker stores, in each cache slot, the group and the full token prefix that produced
it, copies blocks for swaps, and writes all of a step's tokens before checking any context
(as the attention backend does), so a wrong prefix hit, a bad swap or a block reused too
early fails the test. With speculation on, the fake worker proposes random drafts after
each sample and accepts a random prefix of the ones it verifies, so rejected positions are
rolled back and their blocks freed (the worker cuts its tables as told). At the end every
request has finished or been aborted (no starvation or deadlock) and every block, device
and host, is free again (cached-but-evictable blocks count as free). A sliding-window group
is checked on the keys its queries can see: those must be present and exact, while the
blocks before them may have been let go (null in the scheduler's table).

With a fake asynchronous KV connector (distributed/kv_transfer/'s interface, one
full-attention group), some requests have their prompt KV (all but the last token) loaded
from elsewhere: they wait parked while other requests run, the fake worker writes the
loaded slots a random number of steps later (or the load fails: the request fails, or
computes the prompt itself, as the drawn kv_load_failure_policy says; an aborted request's
late load is never written), and some finished requests' blocks are held until a peer
"pulls" them. The same checks then prove that a request reads exactly its loaded prefix
and that parked and held blocks are neither lost nor shared early.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedllm.config import MIN_PREFILL_CHUNK
from pagedllm.core.kv_cache_groups import KVCacheGroupSpec
from pagedllm.core.kv_cache_manager import KVCacheManager
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.step_plan import is_prefill
from pagedllm.distributed.kv_transfer.base import KVConnectorOutput
from pagedllm.request import Request, RequestData, RequestStatus
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.outputs import ModelRunnerOutput
from tests.core.test_scheduler import EOS, make_scheduler

# What a cache slot holds in the simulation: the KV cache group that wrote it and the token
# prefix whose last token's K/V it is.
Slot = tuple[int, tuple[int, ...]]


@dataclass
class _WorkerRequest:
    token_ids: list[int]
    block_ids: list[list[int]]  # per KV cache group
    num_computed_tokens: int


@dataclass
class _FakeTransferConfig:
    kv_load_failure_policy: str


class FakeAsyncConnector:
    """The scheduler half of a connector that loads the prompts of `remote_ids` (all but
    their last token) asynchronously and holds the blocks of `held_ids` once they finish."""

    def __init__(self, remote_ids: set[str], held_ids: set[str], policy: str) -> None:
        self.config = _FakeTransferConfig(policy)
        self.remote_ids, self.held_ids = remote_ids, held_ids
        self.offered: set[str] = set()
        self.loads: list[tuple[str, list[int], int, int, list[int]]] = []
        self.held: list[str] = []

    def get_num_new_matched_tokens(self, request: Request, num_computed: int
                                   ) -> tuple[int, bool]:
        if request.request_id not in self.remote_ids or request.request_id in self.offered:
            return 0, False
        count = request.num_prompt_tokens - 1 - num_computed
        return max(0, count), count > 0

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external: int) -> None:
        if num_external:
            self.offered.add(request.request_id)
            end = request.num_computed_tokens
            self.loads.append((request.request_id, list(block_ids), end - num_external, end,
                               list(request.prompt_token_ids)))

    def build_connector_meta(self, scheduled: list) -> list:
        loads, self.loads = self.loads, []
        return loads

    def load_failed(self, request: Request) -> None:
        pass

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, None]:
        if request.request_id in self.held_ids and request.status in (
                RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            self.held.append(request.request_id)
            return True, None
        return False, None


class FakeWorker:
    """Applies SchedulerOutput diffs as a real worker would, simulating KV contents."""

    def __init__(
        self, scheduler: Scheduler, rng: random.Random, eos_prob: float, num_spec: int = 0
    ) -> None:
        self.scheduler = scheduler
        self.num_spec = num_spec  # most draft tokens proposed per request (0: off)
        self.block_size = scheduler.cache_config.block_size
        self.rng = rng
        self.eos_prob = eos_prob
        self.requests: dict[str, _WorkerRequest] = {}
        self.device_kv: dict[int, list[Slot | None]] = {}
        self.host_kv: dict[int, list[Slot | None]] = {}
        self.num_computed_prompt_tokens = 0
        self.windows = [group.sliding_window for group in scheduler.kv_cache_manager.groups]
        # A fake async connector's loads in flight: request id -> (steps left, fails, load).
        self.loads: dict[str, tuple[int, bool, tuple]] = {}
        self.sends: dict[str, int] = {}  # held request -> steps until a peer pulls it

    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in output.finished_request_ids:
            self.requests.pop(request_id, None)
            self.loads.pop(request_id, None)  # an ended request's load is never written
        self._swap(output)
        for new in output.scheduled_new_reqs:
            assert new.request_id not in self.requests, "worker already holds this request"
            token_ids = new.data.prompt_token_ids + new.output_token_ids
            self.requests[new.request_id] = _WorkerRequest(
                token_ids, [list(table) for table in new.block_ids], new.num_computed_tokens
            )
        cached = output.scheduled_cached_reqs
        kept = cached.num_blocks_kept or [None] * cached.num_requests
        for request_id, block_ids, num_computed, num_kept in zip(
            cached.request_ids, cached.new_block_ids, cached.num_computed_tokens, kept,
            strict=True,
        ):
            state = self.requests[request_id]
            assert state.num_computed_tokens == num_computed
            for table, new_ids in zip(state.block_ids, block_ids, strict=True):
                if num_kept is not None:
                    del table[num_kept:]
                table += new_ids
        self._write_kv(output)
        self._check_contexts(output)
        runner_output = self._sample(output)
        runner_output.kv_connector_output = self._transfers(output)
        return runner_output

    def _transfers(self, output: SchedulerOutput) -> KVConnectorOutput | None:
        """Start the step's loads; finish (write) or fail those whose time came; pull
        held blocks after a while."""
        connector = self.scheduler.kv_connector
        if connector is None:
            return None
        for load in output.kv_connector_metadata or []:
            self.loads[load[0]] = (self.rng.randrange(4), self.rng.random() < 0.2, load)
        for request_id in connector.held:
            self.sends[request_id] = self.rng.randrange(4)
        connector.held = []
        news = KVConnectorOutput()
        for request_id, (steps, fails, load) in list(self.loads.items()):
            if steps:
                self.loads[request_id] = (steps - 1, fails, load)
                continue
            del self.loads[request_id]
            if fails:
                news.failed_recving.add(request_id)
                continue
            _, block_ids, start, end, prompt = load
            for position in range(start, end):
                block = self.device_kv.setdefault(block_ids[position // self.block_size],
                                                  [None] * self.block_size)
                block[position % self.block_size] = (0, tuple(prompt[: position + 1]))
            news.finished_recving.add(request_id)
        for request_id, steps in list(self.sends.items()):
            if steps:
                self.sends[request_id] = steps - 1
            else:
                del self.sends[request_id]
                news.finished_sending.add(request_id)
        return news

    def _swap(self, output: SchedulerOutput) -> None:
        # Out before in, as the worker does; the scheduler never overlaps them.
        out_blocks = {device for device, _ in output.blocks_to_swap_out}
        in_blocks = {device for device, _ in output.blocks_to_swap_in}
        assert not (output.blocks_to_swap_out and output.blocks_to_swap_in)
        assert not out_blocks & in_blocks
        for device, host in output.blocks_to_swap_out:
            self.host_kv[host] = list(self.device_kv[device])
        for device, host in output.blocks_to_swap_in:
            self.device_kv[device] = list(self.host_kv.pop(host))

    def _write_kv(self, output: SchedulerOutput) -> None:
        """Every scheduled token writes its slot in every group, before any request reads
        its context."""
        for request_id, num_tokens in output.num_scheduled_tokens.items():
            state = self.requests[request_id]
            start = state.num_computed_tokens
            tokens = state.token_ids + output.scheduled_spec_decode_tokens.get(request_id, [])
            for group_id, table in enumerate(state.block_ids):
                for position in range(start, start + num_tokens):
                    block_id = table[position // self.block_size]
                    assert block_id != 0, "the null block was handed out"
                    block = self.device_kv.setdefault(block_id, [None] * self.block_size)
                    prefix = tuple(tokens[: position + 1])
                    block[position % self.block_size] = (group_id, prefix)

    def _check_contexts(self, output: SchedulerOutput) -> None:
        """Each request's context (cached, swapped in, or new) is its own prefix, as far
        back as each group's queries see."""
        block_size = self.block_size
        manager = self.scheduler.kv_cache_manager
        for request_id, num_tokens in output.num_scheduled_tokens.items():
            state = self.requests[request_id]
            start, end = state.num_computed_tokens, state.num_computed_tokens + num_tokens
            tokens = state.token_ids + output.scheduled_spec_decode_tokens.get(request_id, [])
            tables = manager.get_block_ids(request_id)
            for group_id, (table, window) in enumerate(zip(tables, self.windows, strict=True)):
                # The worker's table only grows; the scheduler's nulls what was let go.
                worker_table = state.block_ids[group_id]
                assert len(table) == len(worker_table)
                assert all(b in (0, w) for b, w in zip(table, worker_table, strict=True))
                first = 0 if window is None else max(0, start - window + 1)
                for position in range(first, end):
                    block_id = table[position // block_size]
                    assert block_id != 0, f"{request_id} lost a block it still sees"
                    slot = self.device_kv[block_id][position % block_size]
                    assert slot == (group_id, tuple(tokens[: position + 1])), (
                        f"{request_id} reads wrong KV at position {position}"
                    )

    def _sample(self, output: SchedulerOutput) -> ModelRunnerOutput:
        block_size = self.block_size
        sampled: list[list[int]] = []
        drafts: dict[str, list[int]] = {}
        for request_id, num_tokens in output.num_scheduled_tokens.items():
            state = self.requests[request_id]
            verified = output.scheduled_spec_decode_tokens.get(request_id, [])
            state.num_computed_tokens += num_tokens
            assert state.num_computed_tokens <= len(state.token_ids) + len(verified)
            assert state.num_computed_tokens <= self.scheduler.max_model_len
            for table in state.block_ids:
                assert len(table) * block_size >= state.num_computed_tokens
                if self.scheduler.num_lookahead_slots and not state.num_computed_tokens < len(
                    state.token_ids
                ):
                    final = min(self.scheduler.max_model_len, len(state.token_ids) + 1)
                    assert len(table) * block_size >= final, "no lookahead slot"
            if state.num_computed_tokens < len(state.token_ids):
                assert not verified, "drafts scheduled before the prompt was done"
                sampled.append([])  # partial prefill
                continue
            # Accept a random prefix of the drafts; the rest are rolled back.
            num_accepted = 0
            while num_accepted < len(verified) and self.rng.random() < 0.6:
                num_accepted += 1
            state.num_computed_tokens -= len(verified) - num_accepted
            is_eos = self.rng.random() < self.eos_prob
            token_id = EOS if is_eos else self.rng.randrange(3, 50)
            emitted = verified[:num_accepted] + [token_id]
            state.token_ids.extend(emitted)
            sampled.append(emitted)
            if self.num_spec:
                count = self.rng.randrange(self.num_spec + 1)
                drafts[request_id] = [self.rng.randrange(3, 50) for _ in range(count)]
        output_ = ModelRunnerOutput(list(output.num_scheduled_tokens), sampled)
        output_.spec_token_ids = {r: d for r, d in drafts.items() if d}
        return output_


def check_blocks(scheduler: Scheduler, all_requests: list[Request]) -> None:
    """Ref counts equal holders; no block is both free and held; free + held == usable."""
    manager = scheduler.kv_cache_manager
    holders: dict[int, int] = {}
    for request in all_requests:
        block_ids = [i for table in manager.get_block_ids(request.request_id) for i in table]
        parked = request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        held = request.request_id in scheduler.kv_sending
        if request.status != RequestStatus.RUNNING and not (parked or held):
            assert block_ids == [], f"{request.request_id} holds blocks while not running"
        for block_id in block_ids:
            if block_id:  # 0: a block a sliding window let go
                holders[block_id] = holders.get(block_id, 0) + 1
    free = {b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()}
    assert free.isdisjoint(holders)
    assert len(free) + len(holders) == manager.num_usable_blocks
    for block in manager.block_pool.blocks:
        assert block.ref_cnt == holders.get(block.block_id, 0)


def check_output(scheduler: Scheduler, output: SchedulerOutput) -> None:
    config = scheduler.scheduler_config
    counts = output.num_scheduled_tokens
    assert output.total_num_scheduled_tokens == sum(counts.values())
    assert output.total_num_scheduled_tokens <= config.max_num_batched_tokens
    assert len(counts) <= config.max_num_seqs
    assert all(count > 0 for count in counts.values())
    scheduled = [new.request_id for new in output.scheduled_new_reqs]
    scheduled += output.scheduled_cached_reqs.request_ids
    assert sorted(scheduled) == sorted(counts)


def check_prefill_cap(scheduler: Scheduler, output: SchedulerOutput, num_decoding: int) -> None:
    """With decodes running, the step's prompt tokens stay within the prefill cap."""
    config = scheduler.scheduler_config
    if not (config.prefill_tokens_per_decode and config.enable_chunked_prefill
            and num_decoding):
        return
    prompt_tokens = 0
    for request_id, count in output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        if is_prefill(request, request.num_computed_tokens - count):  # its start this step
            prompt_tokens += count
    assert prompt_tokens <= max(MIN_PREFILL_CHUNK, config.prefill_tokens_per_decode * num_decoding)


@st.composite
def kv_cache_groups(draw: st.DrawFn) -> tuple[KVCacheGroupSpec, ...] | None:
    """None (one full-attention group), one sliding group, or sliding and full groups."""
    kind = draw(st.sampled_from(["full", "sliding", "hybrid"]))
    if kind == "full":
        return None
    window = draw(st.integers(1, 10))
    if kind == "sliding":
        return (KVCacheGroupSpec((0,), window),)
    return (KVCacheGroupSpec((0,), window), KVCacheGroupSpec((1,)))


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, object]:
    block_size = draw(st.integers(1, 4))
    max_model_len = draw(st.integers(2, 24))
    chunked = draw(st.booleans())
    budget = draw(st.integers(1 if chunked else max_model_len, 40))
    groups = draw(kv_cache_groups())
    # One request must always fit alone.
    sizing = KVCacheManager(2, block_size, groups=groups, max_chunk_tokens=budget)
    min_usable = sizing.get_num_blocks_needed(max_model_len)
    num_blocks = 1 + min_usable + draw(st.integers(0, 4))
    request = st.tuples(
        st.integers(0, 4),  # arrival step
        st.integers(1, max_model_len),  # prompt length
        st.integers(1, 16),  # max_tokens
        st.booleans(),  # ignore_eos
        st.one_of(st.none(), st.integers(0, 30)),  # abort step
        st.booleans(),  # abort between schedule and update
        st.integers(0, 3),  # priority
        st.one_of(st.none(), st.integers(0, 2)),  # shared prefix index
    )
    return {
        "scheduler": make_scheduler(
            max_num_seqs=draw(st.integers(1, 6)),
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            block_size=block_size,
            num_blocks=num_blocks,
            enable_chunked_prefill=chunked,
            enable_prefix_caching=draw(st.booleans()),
            preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
            scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
            num_cpu_blocks=draw(st.integers(0, 12)),
            kv_cache_groups=groups,
            # A drafter with a KV cache of its own takes lookahead slots each step (the
            # engine runs one only where every layer attends to the whole context).
            num_lookahead_slots=draw(st.sampled_from([0, 0, 2])) if groups is None else 0,
            # Prompt tokens a step may compute beside decodes (0: no cap).
            prefill_tokens_per_decode=draw(st.sampled_from([0, 0, 1, 5])),
        ),
        "requests": draw(st.lists(request, min_size=2, max_size=10)),
        "seed": draw(st.integers(0, 2**16)),
        "eos_prob": draw(st.sampled_from([0.0, 0.05, 0.3])),
        "num_spec": draw(st.sampled_from([0, 0, 1, 3])),
        # A fake async KV connector (one full-attention group only, as the real ones):
        # which requests load remote KV, which are held once finished, the policy.
        "connector": draw(st.none() | st.tuples(
            st.sets(st.integers(0, 9)), st.sets(st.integers(0, 9)),
            st.sampled_from(["fail", "recompute"]))) if groups is None else None,
    }


def _make_requests(specs: list[tuple], max_model_len: int, rng: random.Random) -> list[Request]:
    # A few shared "system prompts": requests that pick one start with (part of) it.
    prefixes = [[rng.randrange(3, 50) for _ in range(max_model_len)] for _ in range(3)]
    requests = []
    for index, spec in enumerate(specs):
        _, prompt_len, max_tokens, ignore_eos, _, _, priority, prefix_index = spec
        prefix = prefixes[prefix_index][:prompt_len] if prefix_index is not None else []
        prompt = prefix + [rng.randrange(3, 50) for _ in range(prompt_len - len(prefix))]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        request = Request(f"r{index}", RequestData(prompt, params, EOS))
        request.priority = priority
        requests.append(request)
    return requests


def _check_after_update(scheduler: Scheduler, requests: list[Request], worker: FakeWorker) -> None:
    scheduler.check_integrity()
    check_blocks(scheduler, requests)
    for request in scheduler.running:
        assert worker.requests[request.request_id].token_ids == request.all_token_ids
    for request in scheduler.swapped:
        assert request.request_id not in worker.requests


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_keep_invariants_and_finish(workload: dict) -> None:
    scheduler: Scheduler = workload["scheduler"]
    specs: list[tuple] = workload["requests"]
    rng = random.Random(workload["seed"])
    worker = FakeWorker(scheduler, rng, workload["eos_prob"], workload["num_spec"])
    requests = [*_make_requests(specs, scheduler.max_model_len, rng)]
    if workload["connector"] is not None:
        remote, held, policy = workload["connector"]
        scheduler.kv_connector = FakeAsyncConnector(
            {f"r{i}" for i in remote}, {f"r{i}" for i in held}, policy)
    last_arrival = max(s[0] for s in specs)
    # Generous: preemption (recompute) and priority preemption redo work.
    max_steps = 10 * (last_arrival + sum(s[1] + s[2] for s in specs)) + 20
    for step_index in range(max_steps):
        for request, spec in zip(requests, specs, strict=True):
            if spec[0] == step_index:
                scheduler.add_request(request)
            if spec[4] == step_index and not spec[5]:
                scheduler.abort_requests([request.request_id])
        num_decoding = sum(1 for r in scheduler.running
                           if not is_prefill(r, r.num_computed_tokens))
        output = scheduler.schedule()
        scheduler.check_integrity()
        check_output(scheduler, output)
        check_prefill_cap(scheduler, output, num_decoding)
        check_blocks(scheduler, requests)
        runner_output = worker.execute(output)
        for request, spec in zip(requests, specs, strict=True):
            if spec[4] == step_index and spec[5]:
                scheduler.abort_requests([request.request_id])
        scheduler.update_from_output(output, runner_output)
        _check_after_update(scheduler, requests, worker)
        if step_index > last_arrival and not (scheduler.has_unfinished_requests()
                                              or scheduler.has_pending_kv_transfers()):
            break
    assert not scheduler.has_unfinished_requests(), "a request starved or deadlocked"
    assert not scheduler.has_pending_kv_transfers(), "held blocks were never freed"
    assert all(request.is_finished() for request in requests)
    assert scheduler.kv_cache_usage == 0.0
    manager = scheduler.kv_cache_manager
    assert manager.get_num_free_blocks() == manager.num_usable_blocks
    swap = scheduler.swap_manager
    assert (
        swap.block_pool is None or swap.get_num_free_blocks() == swap.block_pool.num_usable_blocks
    )
    for request in requests:
        assert request.num_output_tokens <= request.max_tokens
        assert request.num_tokens <= max(scheduler.max_model_len, request.num_prompt_tokens + 1)
