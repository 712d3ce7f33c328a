"""The server reports prefix-cache hits as OpenAI does: usage.prompt_tokens_details.
cached_tokens, for completions and chat, whole and streamed (include_usage)."""

from __future__ import annotations

from .conftest import MODEL_NAME

# Long enough for two full 16-token blocks whatever the tokenizer does with it.
LONG_PROMPT = " ".join(f"cache probe word {i}" for i in range(24))


def test_completion_reports_cached_prompt_tokens(client):
    def complete(**kwargs):
        return client.completions.create(model=MODEL_NAME, prompt=LONG_PROMPT + " a",
                                         max_tokens=2, temperature=0, **kwargs)

    complete()
    again = complete()
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 32 <= cached < again.usage.prompt_tokens and cached % 16 == 0
    chunks = list(complete(stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached


def test_chat_reports_cached_prompt_tokens(client):
    messages = [{"role": "user", "content": LONG_PROMPT + " b"}]

    def chat(**kwargs):
        return client.chat.completions.create(model=MODEL_NAME, messages=messages,
                                              max_tokens=2, temperature=0, **kwargs)

    first = chat()
    assert first.usage.prompt_tokens_details.cached_tokens % 16 == 0
    again = chat()
    assert again.usage.prompt_tokens_details.cached_tokens >= 32
    chunks = list(chat(stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (
        again.usage.prompt_tokens_details.cached_tokens)
