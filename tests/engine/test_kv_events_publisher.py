"""KV cache events end to end: an engine with kv_events_config publishes each step's events
over ZMQ as vLLM frames them ([topic, 8-byte sequence, msgpack KVEventBatch]), a subscriber
decodes them with the batch type, and the replay socket resends buffered batches from a
sequence number."""

from __future__ import annotations

import socket
import time

import msgspec
import pytest
import zmq

from pagedllm import LLM, SamplingParams
from pagedllm.core.kv_events import AllBlocksCleared, BlockStored, KVEventBatch
from pagedllm.engine.kv_events_publisher import END_SEQ


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    pub, replay = _free_port(), _free_port()
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, block_size=16,
              num_gpu_blocks_override=64, enable_prefix_caching=True,
              kv_events_config={"enable_kv_cache_events": True, "topic": "kv",
                                "endpoint": f"tcp://*:{pub}",
                                "replay_endpoint": f"tcp://*:{replay}"})
    yield llm, pub, replay
    llm.llm_engine.shutdown()


def test_subscriber_reads_stored_blocks_then_replay(engine):
    llm, pub, replay = engine
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(f"tcp://127.0.0.1:{pub}")
    time.sleep(0.5)  # a PUB socket drops messages until the subscription has arrived
    prompt = list(range(5, 37))  # 32 tokens: 2 full blocks
    llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1), use_tqdm=False)
    assert sub.poll(10_000), "no event batch arrived"
    topic, seq, payload = sub.recv_multipart()
    batch = msgspec.msgpack.Decoder(type=KVEventBatch).decode(payload)
    assert topic == b"kv" and int.from_bytes(seq, "big") == 0
    assert batch.data_parallel_rank == 0 and batch.ts > 0
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    assert len(stored.block_hashes) == 2 and stored.parent_block_hash is None
    assert stored.token_ids == prompt and stored.block_size == 16 and stored.lora_id is None
    # Reset: one AllBlocksCleared batch.
    assert llm.reset_prefix_cache()
    assert sub.poll(10_000)
    _, seq, payload = sub.recv_multipart()
    assert int.from_bytes(seq, "big") == 1
    assert msgspec.msgpack.Decoder(type=KVEventBatch).decode(payload).events == [
        AllBlocksCleared()]
    # Replay from sequence 1: that batch, then the end marker. A DEALER reads every reply
    # (a REQ socket, as vLLM's clients use, reads the first); it sends REQ's envelope.
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay}")
    dealer.send_multipart([b"", (1).to_bytes(8, "big")])
    frames = []
    while not frames or frames[-1][0] != END_SEQ:
        assert dealer.poll(10_000), frames
        empty, *rest = dealer.recv_multipart()
        assert empty == b""
        frames.append(rest)
    assert [int.from_bytes(f[0], "big") for f in frames[:-1]] == [1]
    assert frames[-1] == [END_SEQ, b""]
    sub.close(linger=0)
    dealer.close(linger=0)


@pytest.mark.parametrize("config, text", [
    ({"enable_kv_cache_events": True, "endpoit": "tcp://*:1"}, "unknown keys \\['endpoit'\\]"),
    ({"enable_kv_cache_events": True, "publisher": "kafka"}, "publisher must be"),
    ({"enable_kv_cache_events": True, "buffer_steps": 0}, "buffer_steps must be"),
    ("{not json", "kv_events_config"),
])
def test_bad_configs_name_the_field(config, text):
    from pagedllm.engine.arg_utils import EngineArgs

    with pytest.raises(ValueError, match=text):
        EngineArgs(kv_events_config=config)._kv_events_config()


def test_data_parallel_cores_get_their_own_ports():
    from pagedllm.config import KVEventsConfig

    config = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://*:5557",
                            replay_endpoint="tcp://*:5657")
    second = config.for_rank(1)
    assert (second.endpoint, second.replay_endpoint, second.data_parallel_rank) == (
        "tcp://*:5558", "tcp://*:5658", 1)
    assert config.for_rank(0) == config and config.publisher == "zmq"
    assert KVEventsConfig().publisher == "null" and not KVEventsConfig().publishes
