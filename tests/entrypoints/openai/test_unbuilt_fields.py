"""vLLM request fields this server does not build answer 400 naming the field (they would
change the answer), unless they carry their neutral value; unknown fields stay ignored."""

from __future__ import annotations

import pytest

from pagedllm.entrypoints.openai.protocol import UNBUILT_VLLM_FIELDS

from .conftest import MODEL_NAME

BASE = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
CHANGED = {"return_token_offsets": True, "thinking_token_budget": 5, "stream_interval": 4,
           "return_prompt_text": True, "truncation_side": "right",
           # Per-request processors (vLLM v1 refuses them too; engine plugins are built).
           "logits_processors": ["pkg.mod:Proc"]}


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_an_unbuilt_field_answers_400(http, field):
    for path, body in [("/v1/completions", BASE),
                       ("/v1/chat/completions", {**BASE, "prompt": None,
                                                 "messages": [{"role": "user", "content": "Hi"}]})]:
        body = {k: v for k, v in body.items() if v is not None}
        response = http.post(path, json={**body, field: CHANGED[field]})
        assert response.status_code == 400, (path, field)
        error = response.json()["error"]
        assert error["param"] == field and "not supported" in error["message"]


def test_neutral_values_and_unknown_fields_are_accepted(http):
    neutral = {name: value for name, value in UNBUILT_VLLM_FIELDS.items()}
    response = http.post("/v1/completions", json={**BASE, **neutral, "some_new_field": 1})
    assert response.status_code == 200
