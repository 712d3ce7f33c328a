"""Structured outputs through the server (tiny random Llama): response_format, vLLM's
structured_outputs and guided_* extras, the openai client's parse(), and 400s naming the
field. Constraints have finite languages, so a random model's outputs always complete."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "level": {"type": "integer", "minimum": 1, "maximum": 5},
        "color": {"enum": ["red", "blue"]},
    },
    "required": ["ok", "level", "color"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe the fox as JSON."}]


def _chat(client, **kwargs):
    kwargs = {"max_tokens": 300, "temperature": 0.0, **kwargs}
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MESSAGES, **kwargs
    )


def _complete(client, **kwargs):
    kwargs = {"max_tokens": 300, "temperature": 0.0, **kwargs}
    return client.completions.create(
        model=client.models.list().data[0].id, prompt="The fox", **kwargs
    )


def test_response_format_json_schema(client):
    response_format = {"type": "json_schema",
                       "json_schema": {"name": "fox", "schema": SCHEMA, "strict": True}}
    out = _chat(client, response_format=response_format)
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in _chat(client, response_format=response_format, stream=True)
        if chunk.choices
    )
    assert streamed == out.choices[0].message.content


def test_response_format_json_object_on_completions(client):
    out = _complete(client, extra_body={"response_format": {"type": "json_object"}},
                    max_tokens=40)
    assert out.choices[0].text.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": r"[xy]{3}"}, lambda t: re.fullmatch(r"[xy]{3}", t)),
        ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right")),
        ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"guided_grammar": 'root ::= "a" [0-9] "z"'}, lambda t: re.fullmatch(r"a[0-9]z", t)),
        ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
    ],
)
def test_vllm_extras(client, extra, check):
    out = _complete(client, extra_body=extra)
    assert out.choices[0].finish_reason == "stop"
    assert check(out.choices[0].text), out.choices[0].text


class Fox(BaseModel):
    """What the openai client's parse() asks for (strict schema from pydantic)."""

    hungry: bool
    legs: int = Field(ge=0, le=4)
    mood: Literal["calm", "wild"]


def test_openai_client_parse(client):
    out = client.chat.completions.parse(
        model=client.models.list().data[0].id, messages=MESSAGES, max_tokens=200,
        temperature=0.0, response_format=Fox,
    )
    parsed = out.choices[0].message.parsed
    assert isinstance(parsed, Fox)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
         "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"extra_body": {"guided_regex": "a(b"}}, "guided_regex"),
        ({"extra_body": {"guided_json": "{not json"}}, "guided_json"),
        ({"extra_body": {"guided_choice": []}}, "guided_choice"),
        ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}},
         "structured_outputs"),
        ({"extra_body": {"guided_regex": "a", "guided_choice": ["b"]}}, "guided_choice"),
        ({"extra_body": {"guided_whitespace_pattern": " "}}, "guided_whitespace_pattern"),
    ],
)
def test_bad_constraints_are_400_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, **kwargs)
    assert info.value.body["param"] == param
    # The server keeps serving.
    assert _chat(client, max_tokens=2).choices[0].message.content is not None
