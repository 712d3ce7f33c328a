"""kv_transfer_params as vLLM carries them: offline in SamplingParams.extra_args, in the
server as the request field, to the KV connector; what the connector reports when the
request finishes comes back in RequestOutput.kv_transfer_params and the response's
`kv_transfer_params`. A connector of one's own loads from kv_connector_module_path (without
any connector the field answers 400: tests/entrypoints/openai/test_errors.py)."""

from __future__ import annotations

import json

import pytest

from pagedllm import LLM, SamplingParams
from tests.entrypoints.openai.conftest import http_client, start_server, stop_server

ECHO = {"kv_connector": "EchoConnector", "engine_id": "prefill-0",
        "kv_connector_module_path": "tests.distributed.kv_transfer.echo_connector"}


def test_offline_params_reach_the_connector_and_come_back(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, block_size=16,
              kv_transfer_config=ECHO)
    try:
        params = SamplingParams(max_tokens=1, extra_args={
            "kv_transfer_params": {"do_remote_decode": True}})
        out = llm.generate({"prompt_token_ids": list(range(5, 25))}, params,
                           use_tqdm=False)[0]
        assert out.kv_transfer_params == {"echo": {"do_remote_decode": True},
                                          "num_blocks": 2, "engine_id": "prefill-0"}
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("config, text", [
    ({"kv_connector": "Nope", "kv_connector_module_path": "tests.distributed.kv_transfer"
      ".echo_connector"}, "no connector 'Nope'"),
    ({"kv_connector": "EchoConnector", "kv_connector_module_path": "no.such.module"},
     "no connector"),
])
def test_bad_module_connectors(tiny_llama_dir, config, text):
    with pytest.raises(ValueError, match=text):
        LLM(str(tiny_llama_dir), kv_transfer_config=config)


def test_server_request_field_and_response_field(tiny_llama_dir, tmp_path):
    server = start_server([str(tiny_llama_dir), "--max-model-len", "128", "--block-size", "16",
                           "--num-gpu-blocks-override", "64",
                           "--kv-transfer-config", json.dumps(ECHO)], tmp_path / "log")
    try:
        with http_client(server) as http:
            body = {"prompt": list(range(5, 25)), "max_tokens": 1,
                    "kv_transfer_params": {"do_remote_decode": True}}
            completion = http.post("/v1/completions", json=body).json()
            assert completion["kv_transfer_params"]["echo"] == {"do_remote_decode": True}
            chat = http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                "kv_transfer_params": {"do_remote_prefill": False}}).json()
            assert chat["kv_transfer_params"]["echo"] == {"do_remote_prefill": False}
    finally:
        stop_server(server)

