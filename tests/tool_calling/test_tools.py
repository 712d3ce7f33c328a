"""tools / tool_choice: OpenAI's defaults, clear errors, and the schemas that force a choice
(valid JSON Schema; a forced reply that validates against it parses back into calls)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pagedllm.structured_output import check_constraint
from pagedllm.tool_calling import RequiredToolOutput, resolve_tool_choice, tool_choice_constraint


def _tool(name, parameters=None):
    function = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


WEATHER = _tool("get_weather", {
    "type": "object", "properties": {"city": {"$ref": "#/$defs/City"}}, "required": ["city"],
    "$defs": {"City": {"type": "string", "enum": ["Paris", "Rome"]}},
})
NOW = _tool("now")
TOOLS = [WEATHER, NOW]


def test_default_choice_is_auto_with_tools_and_none_without():
    assert resolve_tool_choice(TOOLS, None) == "auto"
    assert resolve_tool_choice(None, None) == "none"
    named = {"type": "function", "function": {"name": "now"}}
    assert resolve_tool_choice(TOOLS, named) == named


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        (TOOLS, "sometimes", "must be 'none', 'auto', 'required'"),
        (None, "required", "needs `tools`"),
        (TOOLS, {"type": "function", "function": {"name": "missing"}}, "not in `tools`"),
        (None, {"type": "function", "function": {"name": "now"}}, "`tools` is empty"),
        (TOOLS, {"type": "function"}, "must be {'type': 'function'"),
    ],
)
def test_bad_tool_choice(tools, choice, message):
    with pytest.raises(ValueError, match="tool_choice") as info:
        resolve_tool_choice(tools, choice)
    assert message in str(info.value)


def test_no_constraint_for_none_and_auto():
    assert tool_choice_constraint(TOOLS, "auto") is None
    assert tool_choice_constraint(TOOLS, "none") is None


def test_named_choice_is_the_functions_parameters():
    constraint = tool_choice_constraint(TOOLS, {"type": "function", "function": {"name": "now"}})
    assert constraint.json == {"type": "object", "properties": {}}
    check_constraint(constraint)


def test_required_schema_moves_defs_to_the_root():
    schema = tool_choice_constraint(TOOLS, "required").json
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$defs"] == {"City": {"type": "string", "enum": ["Paris", "Rome"]}}
    reply = '[{"name": "get_weather", "parameters": {"city": "Rome"}}, ' \
            '{"name": "now", "parameters": {}}]'
    jsonschema.validate(json.loads(reply), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Oslo"}}], schema)
    _, calls = RequiredToolOutput().extract(reply)
    assert [c.name for c in calls] == ["get_weather", "now"]
    check_constraint(tool_choice_constraint(TOOLS, "required"))


def test_parallel_tool_calls_false_allows_one_call():
    schema = tool_choice_constraint(TOOLS, "required", parallel_tool_calls=False).json
    assert schema["maxItems"] == 1 and schema["minItems"] == 1


def test_conflicting_defs_are_an_error():
    other = _tool("other", {"type": "object", "properties": {"c": {"$ref": "#/$defs/City"}},
                            "$defs": {"City": {"type": "integer"}}})
    with pytest.raises(ValueError, match="tools: .*City"):
        tool_choice_constraint([WEATHER, other], "required")
