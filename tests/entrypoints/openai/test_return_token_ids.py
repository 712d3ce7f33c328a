"""vLLM's token-id extras, as vLLM's own tests read them: `return_token_ids` puts the prompt's
token ids and each choice's generated ids in the response (streamed: the prompt's once, the
new ids on each chunk) and leaves the fields out otherwise; `return_tokens_as_token_ids`
writes logprobs tokens as "token_id:N"; completions' `logprobs: 0` lists the chosen token."""

from __future__ import annotations

import json

from .conftest import MODEL_NAME

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Say something."}]


def _completion(http, **fields):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, **fields}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_completion_returns_prompt_and_output_token_ids(http):
    plain = _completion(http, logprobs=1)
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]
    choice = _completion(http, return_token_ids=True)["choices"][0]
    tokenized = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT}).json()
    assert choice["prompt_token_ids"] == tokenized["tokens"]
    assert len(choice["token_ids"]) == 5
    detokenized = http.post("/detokenize", json={"model": MODEL_NAME,
                                                 "tokens": choice["token_ids"]}).json()
    assert detokenized["prompt"] == choice["text"]


def test_streamed_completion_gives_prompt_ids_once_and_the_new_ids_per_chunk(http):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 0,
            "stream": True, "return_token_ids": True}
    chunks = []
    with http.stream("POST", "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in choices[1:])
    streamed = [t for c in choices for t in c["token_ids"]]
    whole = _completion(http, max_tokens=6, return_token_ids=True)["choices"][0]
    assert streamed == whole["token_ids"]


def test_tokens_as_token_ids_and_logprobs_zero(http):
    choice = _completion(http, logprobs=0, return_token_ids=True,
                         return_tokens_as_token_ids=True)["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert tokens == [f"token_id:{t}" for t in choice["token_ids"]]
    # logprobs: 0 lists the chosen token alone (vLLM's shape), never an empty dict.
    for token, top in zip(tokens, choice["logprobs"]["top_logprobs"], strict=True):
        assert list(top) == [token]
    # logprobs: 2: the chosen token first, then the top 2 (it may be one of them).
    choice = _completion(http, logprobs=2)["choices"][0]
    for token, top in zip(choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"],
                          strict=True):
        assert next(iter(top)) == token and 2 <= len(top) <= 3


def test_chat_returns_prompt_and_output_token_ids(client):
    plain = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4,
                                           temperature=0)
    assert plain.model_dump().get("prompt_token_ids") is None
    assert plain.choices[0].model_dump().get("token_ids") is None
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    assert isinstance(response.prompt_token_ids, list) and response.prompt_token_ids
    token_ids = response.choices[0].token_ids
    assert [p.token for p in response.choices[0].logprobs.content] == [
        f"token_id:{t}" for t in token_ids
    ]
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0, stream=True,
        extra_body={"return_token_ids": True},
    )
    streamed, first = [], True
    for chunk in stream:
        dumped = chunk.model_dump()
        if first:
            assert chunk.prompt_token_ids == response.prompt_token_ids
            first = False
        else:
            assert "prompt_token_ids" not in dumped
        for choice in dumped["choices"]:
            streamed += choice.get("token_ids") or []
    assert streamed == token_ids


def test_logprob_token_ids_in_completions_and_chat(http, client):
    listed = [5, 17, 42]
    choice = _completion(http, logprob_token_ids=listed, return_token_ids=True,
                         return_tokens_as_token_ids=True)["choices"][0]
    for token_id, top in zip(choice["token_ids"], choice["logprobs"]["top_logprobs"],
                             strict=True):
        assert set(top) == {f"token_id:{t}" for t in (token_id, *listed)}
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True,
        extra_body={"logprob_token_ids": listed, "return_tokens_as_token_ids": True},
    )
    for token in response.choices[0].logprobs.content:
        assert {t.token for t in token.top_logprobs} >= {f"token_id:{t}" for t in listed}
    bad = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT,
                                             "logprob_token_ids": [10**9]})
    assert bad.status_code == 400 and "logprob_token_ids" in bad.json()["error"]["message"]
