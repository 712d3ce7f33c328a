"""StructuredOutputsParams: vLLM's names, one constraint per request, malformed constraints
rejected naming the field before anything is queued."""

from __future__ import annotations

import pytest

from pagedllm import GuidedDecodingParams, SamplingParams, StructuredOutputsParams
from pagedllm.structured_output import parse_constraint


@pytest.mark.parametrize(
    ("kwargs", "kind"),
    [
        ({"json": {"type": "object"}}, "json"),
        ({"json": '{"type": "integer"}'}, "json"),
        ({"regex": "[a-z]+"}, "regex"),
        ({"choice": ["yes", "no"]}, "choice"),
        ({"grammar": 'root ::= "a" | "b"'}, "grammar"),
        ({"json_object": True}, "json_object"),
    ],
)
def test_each_kind_parses(kwargs, kind):
    params = StructuredOutputsParams(**kwargs)
    assert params.kind == kind
    assert parse_constraint(params) is not None


@pytest.mark.parametrize(
    "kwargs", [{}, {"json": {"type": "object"}, "regex": "a"}, {"json_object": False}]
)
def test_exactly_one_constraint(kwargs):
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams(**kwargs)


@pytest.mark.parametrize("choice", [[], ["a", 3], "yes"])
def test_choice_must_be_a_list_of_strings(choice):
    with pytest.raises(ValueError, match="structured_outputs.choice"):
        StructuredOutputsParams(choice=choice)


def test_whitespace_pattern_is_refused_not_ignored():
    with pytest.raises(ValueError, match="whitespace_pattern"):
        StructuredOutputsParams(json={"type": "object"}, whitespace_pattern=r"[ ]?")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"json": '{"type": "object",'}, "structured_outputs.json"),
        ({"json": {"type": "objec"}}, "structured_outputs.json"),
        ({"regex": "a(b"}, "structured_outputs.regex"),
        ({"grammar": 'root ::= "a'}, "structured_outputs.grammar"),
    ],
)
@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_malformed_constraints_name_the_field(kwargs, field, backend):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_constraint(StructuredOutputsParams(**kwargs), backend)


def test_guidance_refuses_structural_tags_by_name():
    with pytest.raises(ValueError, match="structural_tag is not available with the guidance"):
        parse_constraint(StructuredOutputsParams(structural_tag='{"type": "structural_tag"}'),
                         "guidance")


def test_backend_choice():
    from pagedllm.config import StructuredOutputsConfig

    assert StructuredOutputsConfig().resolved_backend == "xgrammar"
    assert StructuredOutputsConfig(backend="guidance").resolved_backend == "guidance"
    with pytest.raises(ValueError, match="backend must be one of"):
        StructuredOutputsConfig(backend="outlines")


def test_guided_decoding_is_the_older_name():
    params = SamplingParams(guided_decoding=GuidedDecodingParams(choice=["a", "b"]))
    assert params.guided_decoding is None
    assert params.structured_outputs is not None and params.structured_outputs.choice == ["a", "b"]
    with pytest.raises(ValueError, match="not both"):
        SamplingParams(
            guided_decoding=GuidedDecodingParams(regex="a"),
            structured_outputs=StructuredOutputsParams(regex="b"),
        )


def test_a_dict_is_taken_as_structured_outputs():
    params = SamplingParams(structured_outputs={"regex": "[0-9]+"})
    assert isinstance(params.structured_outputs, StructuredOutputsParams)
    with pytest.raises(ValueError, match="structured_outputs must be"):
        SamplingParams(structured_outputs=["regex"])


def test_json_whitespace_runs_are_bounded():
    # A small model may otherwise pick whitespace forever and never close the object.
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from pagedllm.structured_output.xgrammar_backend import MAX_WHITESPACE_RUN, parse

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    grammar = parse(StructuredOutputsParams(json=schema))
    assert accepts(grammar, "{\n" + " " * (MAX_WHITESPACE_RUN - 1) + '"a": 1}')
    assert not accepts(grammar, "{" + " " * (MAX_WHITESPACE_RUN + 1) + '"a": 1}')
    compact = parse(StructuredOutputsParams(json=schema, disable_any_whitespace=True))
    assert accepts(compact, '{"a": 1}') and not accepts(compact, '{ "a": 1}')
