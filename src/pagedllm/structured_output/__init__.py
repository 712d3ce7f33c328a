"""Structured outputs: constraining a request's tokens to a JSON schema, regex, choice or
grammar, with a per-step token bitmask (vLLM's design; xgrammar or llguidance does the
grammar work).

The small interface the rest of the engine calls:
  - `check_constraint(params)` (frontend): rejects a malformed constraint with ValueError
    before the request is queued (`parse_constraint` gives the parsed grammar);
  - `StructuredOutputManager` (engine core): compiles grammars off the step loop with an
    LRU cache, gives each request a `RequestGrammar` (its matcher, advanced by the
    scheduler with every accepted token) and fills each step's bitmask;
  - `apply_grammar_bitmask` (model runner): masks the constrained rows' logits in one op.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output.bitmask import apply_grammar_bitmask
from pagedllm.structured_output.manager import (
    RequestGrammar,
    StructuredOutputManager,
    cache_key,
)

# Constraints already found well-formed: the server checks a request's constraint to name
# its field in a 400, the input processor checks every request, prompts share one.
_CHECKED: OrderedDict[tuple[Any, ...], None] = OrderedDict()
_CHECKED_SIZE = 256


def parse_constraint(params: StructuredOutputsParams, backend: str = "xgrammar") -> Any:
    """Parse `params` without a tokenizer, for `backend` ("xgrammar" or "guidance"; the
    library is imported on first use).

    Raises:
        ValueError: naming the field (`structured_outputs.json` ...) when it is malformed.
    """
    if backend == "guidance":
        from pagedllm.structured_output.guidance_backend import grammar_text

        return grammar_text(params)
    from pagedllm.structured_output.xgrammar_backend import parse

    return parse(params)

__all__ = [
    "RequestGrammar",
    "StructuredOutputManager",
    "apply_grammar_bitmask",
    "check_constraint",
    "parse_constraint",
]


def check_constraint(params: StructuredOutputsParams, backend: str = "xgrammar") -> None:
    """`parse_constraint`, remembered for well-formed constraints (a repeat costs a lookup).

    Raises:
        ValueError: naming the field, when the constraint is malformed.
    """
    key = (backend, *cache_key(params))
    if key in _CHECKED:
        _CHECKED.move_to_end(key)
        return
    parse_constraint(params, backend)
    _CHECKED[key] = None
    if len(_CHECKED) > _CHECKED_SIZE:
        _CHECKED.popitem(last=False)
