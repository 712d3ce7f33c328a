"""TcpConnector (vLLM's pull style, as NixlConnector): a producer runs the prompts with
do_remote_decode, holds their blocks and answers with the kv_transfer_params a consumer
pulls them with; the consumer's greedy tokens equal one instance's, with its own prefix
cache serving part of a prompt (only the rest is pulled), across KV cache dtypes (a
measured agreement), and with the producer gone: the request fails with
kv_load_failure_policy "fail" and gives the same tokens with "recompute"; blocks nobody
pulls are freed after their lease; nothing leaks on either side."""

from __future__ import annotations

import os
import time

import pytest

from pagedllm import LLM, SamplingParams
from tests.entrypoints.openai.conftest import free_port

BLOCK = 16
SHARED = [7, 3, 11, 5] * 9  # 36 tokens: 2 full blocks shared by the first two prompts
PROMPTS = [SHARED + [21, 22, 23], SHARED + [40, 41, 42, 43, 44, 45, 46, 47, 48, 49],
           [9, 8, 7, 6, 5] * 8, [4, 2]]
DECODE = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def _engine(model_dir, role, port, extra=None, **kwargs):
    config = {"kv_connector": "TcpConnector", "kv_role": role, "kv_port": port,
              "kv_connector_extra_config": {"pull_timeout_s": 5, **(extra or {})}}
    if "kv_load_failure_policy" in kwargs:
        config["kv_load_failure_policy"] = kwargs.pop("kv_load_failure_policy")
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("num_gpu_blocks_override", 128)
    return LLM(str(model_dir), max_model_len=256, block_size=BLOCK, kv_transfer_config=config,
               **kwargs)


def _prefill(producer, prompts=PROMPTS):
    """The producer's one-token answers and the kv_transfer_params they carry."""
    params = SamplingParams(temperature=0, max_tokens=1,
                            extra_args={"kv_transfer_params": {"do_remote_decode": True}})
    outputs = producer.generate([{"prompt_token_ids": p} for p in prompts], params,
                                use_tqdm=False)
    return [o.kv_transfer_params for o in outputs]


def _decode(consumer, transfer, prompts=PROMPTS):
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                             extra_args={"kv_transfer_params": t}) for t in transfer]
    outputs = consumer.generate(requests, params, use_tqdm=False)
    return outputs


def _tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def _usage(llm):
    core = llm.llm_engine.engine_core.engine_core
    return core.scheduler.kv_cache_usage, core.scheduler


def _step_once(producer):
    """One more step of the producer: its worker reports the blocks pulled (or past their
    lease) and the scheduler frees them."""
    producer.generate([{"prompt_token_ids": [3, 4]}], SamplingParams(max_tokens=1),
                      use_tqdm=False)


def _wait_released(producer):
    """Step the producer until it holds no blocks for a peer (at most 30 s); its
    scheduler."""
    _, scheduler = _usage(producer)
    deadline = time.monotonic() + 30
    while scheduler.kv_sending and time.monotonic() < deadline:
        _step_once(producer)
        time.sleep(0.05)
    return scheduler


@pytest.fixture(scope="module")
def expected(tiny_llama_dir):
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256, block_size=BLOCK,
                num_gpu_blocks_override=128)
    try:
        return _tokens(plain.generate([{"prompt_token_ids": p} for p in PROMPTS], DECODE,
                                      use_tqdm=False))
    finally:
        plain.llm_engine.shutdown()


@pytest.mark.parametrize("shared_memory", [True, False])
def test_consumer_pulls_the_producers_blocks_and_gives_one_instances_tokens(
        tiny_llama_dir, expected, shared_memory):
    # With shared_memory on (off by default), a producer on this host hands the blocks over
    # in /dev/shm (the file removed once read); else as TCP frames.
    port = free_port()
    producer = _engine(tiny_llama_dir, "kv_producer", port)
    consumer = _engine(tiny_llama_dir, "kv_consumer", free_port(), enable_prefix_caching=False,
                       extra={"shared_memory": shared_memory})
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    try:
        assert producer.llm_engine.engine_core.engine_core.scheduler.kv_connector is not None
        transfer = _prefill(producer)
        first = transfer[0]
        assert first["do_remote_prefill"] is True and first["remote_port"] == port
        assert first["remote_block_size"] == BLOCK and len(first["remote_block_ids"]) == 3
        assert producer.llm_engine.engine_core.engine_core.scheduler.kv_sending  # held
        outputs = _decode(consumer, transfer)
        assert _tokens(outputs) == expected
        # Every prompt token but the last came from the producer (the 2-token prompt too).
        assert [o.num_cached_tokens for o in outputs] == [len(p) - 1 for p in PROMPTS]
        assert _usage(consumer)[0] == 0.0
        served = producer.llm_engine.engine_core.engine_core.executor.worker._kv_connector
        if shared_memory and os.path.isdir("/dev/shm"):
            assert len(served._shm_files) == len(PROMPTS)  # one file a pull
            assert set(os.listdir("/dev/shm")) <= shm_before  # each read and removed
        else:
            assert not served._shm_files
        _step_once(producer)  # the producer frees the pulled blocks at its next step
        usage, scheduler = _usage(producer)
        assert usage == 0.0 and not scheduler.kv_sending
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


def test_the_consumer_pulls_only_what_its_prefix_cache_lacks(tiny_llama_dir, expected):
    producer = _engine(tiny_llama_dir, "kv_producer", free_port())
    consumer = _engine(tiny_llama_dir, "kv_consumer", free_port())
    try:
        transfer = _prefill(producer)
        # The consumer computes the first prompt itself: its 2 shared blocks are cached.
        consumer.generate([{"prompt_token_ids": PROMPTS[0]}], DECODE, use_tqdm=False)
        core = consumer.llm_engine.engine_core.engine_core
        before = core.kv_transfer_totals.bytes_received
        outputs = _decode(consumer, transfer[1:2], PROMPTS[1:2])
        assert _tokens(outputs) == expected[1:2]
        assert outputs[0].num_cached_tokens == len(PROMPTS[1]) - 1
        pulled = core.kv_transfer_totals.bytes_received - before
        caches = core.executor.worker.model_runner.kv_caches
        block_bytes = sum(c[:, 0].numel() * c.element_size() for c in caches)
        assert pulled == block_bytes  # the third block (tokens 32-47), not the 2 cached
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_producer_that_is_gone(tiny_llama_dir, expected, policy):
    producer = _engine(tiny_llama_dir, "kv_producer", free_port())
    try:
        transfer = _prefill(producer, PROMPTS[:2])
    finally:
        producer.llm_engine.shutdown()  # nobody serves the blocks now
    consumer = _engine(tiny_llama_dir, "kv_consumer", free_port(),
                       extra={"pull_timeout_s": 1}, kv_load_failure_policy=policy)
    try:
        start = time.monotonic()
        outputs = _decode(consumer, transfer, PROMPTS[:2])
        assert time.monotonic() - start < 60  # bounded by the pull timeout, not a hang
        if policy == "fail":
            assert [o.outputs[0].finish_reason for o in outputs] == ["error", "error"]
        else:
            assert _tokens(outputs) == expected[:2]
            assert [o.num_cached_tokens for o in outputs] == [0, 0]  # computed here
        core = consumer.llm_engine.engine_core.engine_core
        assert core.kv_transfer_totals.failures == 2
        assert core.scheduler.kv_cache_usage == 0.0
    finally:
        consumer.llm_engine.shutdown()


def test_blocks_nobody_pulls_are_freed_after_their_lease(tiny_llama_dir):
    producer = _engine(tiny_llama_dir, "kv_producer", free_port(), extra={"lease_s": 0.2})
    try:
        _prefill(producer, PROMPTS[:1])
        usage, scheduler = _usage(producer)
        assert usage > 0 and len(scheduler.kv_sending) == 1
        # A later request's steps let the worker see the lease end and the blocks go.
        scheduler = _wait_released(producer)
        assert not scheduler.kv_sending and scheduler.kv_cache_usage == 0.0
    finally:
        producer.llm_engine.shutdown()


def test_int8_producer_feeds_a_float32_consumer(tiny_llama_dir, expected):
    producer = _engine(tiny_llama_dir, "kv_producer", free_port(), kv_cache_dtype="int8")
    consumer = _engine(tiny_llama_dir, "kv_consumer", free_port())
    try:
        outputs = _decode(consumer, _prefill(producer))
        # The consumer reads the int8 cache's values, converted: its tokens agree with a
        # float32 instance's position by position (measured 38 of 40 here; int8 rounding
        # may flip a close greedy choice of this random model, and what follows it).
        got = _tokens(outputs)
        agree = sum(a == b for g, e in zip(got, expected, strict=True)
                    for a, b in zip(g, e, strict=True))
        assert agree >= 0.9 * sum(len(e) for e in expected)
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


def test_bfloat16_on_both_sides_gives_one_bfloat16_instances_tokens(tiny_llama_dir):
    plain = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=256, block_size=BLOCK,
                num_gpu_blocks_override=128)
    try:
        want = _tokens(plain.generate([{"prompt_token_ids": p} for p in PROMPTS], DECODE,
                                      use_tqdm=False))
    finally:
        plain.llm_engine.shutdown()
    producer = _engine(tiny_llama_dir, "kv_producer", free_port(), dtype="bfloat16")
    consumer = _engine(tiny_llama_dir, "kv_consumer", free_port(), dtype="bfloat16")
    try:
        assert _tokens(_decode(consumer, _prefill(producer))) == want
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


def test_nixl_connector_is_the_tcp_connector(tiny_llama_dir):
    from pagedllm.distributed.kv_transfer import KVConnectorRole, KVTransferConfig
    from pagedllm.distributed.kv_transfer.factory import make_connector
    from pagedllm.distributed.kv_transfer.tcp import TcpConnector

    config = KVTransferConfig.parse({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    assert isinstance(make_connector(config, KVConnectorRole.SCHEDULER, 16, 0), TcpConnector)


def test_a_one_rank_producer_feeds_a_two_rank_consumer(tiny_llama_dir, expected):
    # Tiny Llama has 2 KV heads: each consumer rank pulls its own one from the producer.
    producer = _engine(tiny_llama_dir, "kv_producer", free_port())
    consumer = _engine(tiny_llama_dir, "kv_consumer", free_port(), tensor_parallel_size=2,
                       kv_cache_memory_bytes=2**22)
    try:
        transfer = _prefill(producer)
        outputs = _decode(consumer, transfer)
        assert _tokens(outputs) == expected
        assert [o.num_cached_tokens for o in outputs] == [len(p) - 1 for p in PROMPTS]
        _step_once(producer)  # every rank pulled: the blocks go at the next step
        usage, scheduler = _usage(producer)
        assert usage == 0.0 and not scheduler.kv_sending
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


def test_blocks_the_consumer_does_not_need_are_released_at_once(tiny_llama_dir):
    # The consumer's own prefix cache has the whole prompt (bar its last token): it pulls
    # nothing and tells the producer to let the blocks go, long before their lease.
    producer = _engine(tiny_llama_dir, "kv_producer", free_port(), extra={"lease_s": 600})
    consumer = _engine(tiny_llama_dir, "kv_consumer", free_port())
    try:
        consumer.generate([{"prompt_token_ids": PROMPTS[0]}], DECODE, use_tqdm=False)
        transfer = _prefill(producer, PROMPTS[:1])
        # Same prompt: its 2 full blocks are cached locally, the last 7 tokens are not,
        # so the consumer pulls only the third block; a prompt whose every block but the
        # last token's is local pulls nothing.
        short = PROMPTS[0][:33]  # 2 full blocks + the last token
        transfer_short = _prefill(producer, [short])
        core = consumer.llm_engine.engine_core.engine_core
        before = core.kv_transfer_totals.bytes_received
        _decode(consumer, transfer_short, [short])
        assert core.kv_transfer_totals.bytes_received == before  # nothing pulled
        _decode(consumer, transfer, PROMPTS[:1])
        scheduler = _wait_released(producer)
        assert not scheduler.kv_sending and scheduler.kv_cache_usage == 0.0
    finally:
        producer.llm_engine.shutdown()
        consumer.llm_engine.shutdown()


def test_a_held_requests_id_is_not_reused_while_held(tiny_llama_dir):
    producer = _engine(tiny_llama_dir, "kv_producer", free_port())
    try:
        _prefill(producer, PROMPTS[:1])
        core = producer.llm_engine.engine_core.engine_core
        (held_id,) = core.scheduler.kv_sending
        from pagedllm.request import Request, RequestData

        with pytest.raises(ValueError, match="still in use"):
            core.scheduler.add_request(Request(held_id, RequestData([1, 2, 3], DECODE)))
    finally:
        producer.llm_engine.shutdown()


@pytest.mark.parametrize("kwargs, text", [
    (dict(data_parallel_size=2), "data_parallel_size > 1"),
    (dict(tensor_parallel_size=2), "tensor parallelism only"),
])
def test_producer_layouts_not_built_are_refused(tiny_llama_dir, kwargs, text):
    config = {"kv_connector": "TcpConnector", "kv_role": "kv_producer"}
    with pytest.raises(ValueError, match=text):
        LLM(str(tiny_llama_dir), kv_transfer_config=config, **kwargs)
