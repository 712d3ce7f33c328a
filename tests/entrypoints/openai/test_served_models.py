"""--lora-modules parsing (vLLM's two forms) and its errors."""

from __future__ import annotations

import pytest

from pagedllm.entrypoints.openai.served_models import LoRAModulePath, parse_lora_modules


def test_name_path_and_json_forms():
    modules = parse_lora_modules([
        "sql=/adapters/sql",
        '{"name": "chat", "path": "/adapters/chat", "base_model_name": "base"}',
    ])
    assert modules == [LoRAModulePath("sql", "/adapters/sql"),
                       LoRAModulePath("chat", "/adapters/chat", "base")]
    assert parse_lora_modules(None) == []


@pytest.mark.parametrize("values, words", [
    (["sql"], "name=path"),
    (["=/x"], "name=path"),
    (['{"name": "a"'], "not valid JSON"),
    (['{"name": "a", "path": "/x", "rank": 8}'], "unknown: ['rank']"),
    (['{"path": "/x"}'], "\"name\""),
    (["a=/x", "a=/y"], "more than once"),
])
def test_malformed_entries_are_refused(values, words):
    with pytest.raises(ValueError, match="--lora-modules") as error:
        parse_lora_modules(values)
    assert words in str(error.value)
