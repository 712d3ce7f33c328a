"""The request's `tools` and `tool_choice`: checks, and the grammar that forces a choice.

`tool_choice="required"` and a named function are enforced with a JSON-schema constraint
built from the tools' `parameters`, so the arguments always validate: the named function's
schema itself, or for `required` a list of `{"name", "parameters"}` objects, one schema per
tool. Tools are OpenAI's dicts: `{"type": "function", "function": {"name", "parameters"}}`.
The forced JSON is compact (no free whitespace): arguments are read by programs, and a
small model left free to emit whitespace can wander in it until max_tokens.
"""

from __future__ import annotations

from typing import Any

from pagedllm.sampling_params import StructuredOutputsParams

_NO_PARAMETERS = {"type": "object", "properties": {}}


def resolve_tool_choice(tools: list[dict[str, Any]] | None, tool_choice: Any) -> Any:
    """`tool_choice` with OpenAI's default filled in ("auto" with tools, else "none").

    Raises:
        ValueError: (starting "tool_choice") for a choice the tools cannot satisfy.
    """
    if tool_choice is None:
        return "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ValueError(
                f"tool_choice must be 'none', 'auto', 'required' or a named function, "
                f"got {tool_choice!r}."
            )
        if tool_choice == "required" and not tools:
            raise ValueError("tool_choice 'required' needs `tools`.")
        return tool_choice
    name = named_function(tool_choice)
    if not tools:
        raise ValueError("tool_choice names a function but `tools` is empty.")
    if name not in [function_of(tool)["name"] for tool in tools]:
        raise ValueError(f"tool_choice names function {name!r}, which is not in `tools`.")
    return tool_choice


def named_function(tool_choice: Any) -> str | None:
    """The function a `{"type": "function", "function": {"name": ...}}` choice names.

    Raises:
        ValueError: when `tool_choice` is a dict of another shape.
    """
    if not isinstance(tool_choice, dict):
        return None
    function = tool_choice.get("function")
    if tool_choice.get("type") != "function" or not isinstance(function, dict) or not (
        isinstance(function.get("name"), str)
    ):
        raise ValueError(
            "tool_choice as an object must be {'type': 'function', 'function': {'name': ...}}."
        )
    return str(function["name"])


def function_of(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's `function` object."""
    return dict(tool["function"])


def parameters_of(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema (no parameters: the empty object)."""
    return dict(function_of(tool).get("parameters") or _NO_PARAMETERS)


def tool_choice_constraint(
    tools: list[dict[str, Any]], tool_choice: Any, parallel_tool_calls: bool = True,
) -> StructuredOutputsParams | None:
    """The constraint that enforces `tool_choice` (None for "none" and "auto").

    Raises:
        ValueError: (naming "tools") when two tools define one `$defs` entry differently.
    """
    name = named_function(tool_choice)
    if name is not None:
        tool = next(t for t in tools if function_of(t)["name"] == name)
        return StructuredOutputsParams(json=parameters_of(tool), disable_any_whitespace=True)
    if tool_choice != "required":
        return None
    return StructuredOutputsParams(json=_required_schema(tools, parallel_tool_calls),
                                   disable_any_whitespace=True)


def _required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """A list of one or more calls, each the name of a tool with its own parameters."""
    definitions: dict[str, Any] = {}
    variants = []
    for tool in tools:
        parameters = parameters_of(tool)
        # `$ref`s point at the document's root, so each tool's `$defs` move up there.
        for key, value in parameters.pop("$defs", {}).items():
            if key in definitions and definitions[key] != value:
                raise ValueError(
                    f"tools: two tools define $defs {key!r} differently; rename one."
                )
            definitions[key] = value
        variants.append({
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [function_of(tool)["name"]]},
                "parameters": parameters,
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        })
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return schema

