"""The llguidance backend ("guidance"): JSON schema, regex, choice and EBNF/Lark grammars,
matched token by token by llguidance's lazy parser.

Measured against xgrammar on the default model (benchmarks in BENCHMARKS.md): compiling a
schema takes 1-2 ms instead of 10-100 ms, but each token's mask takes 23-79 us instead of
15-21 us. It pays where most requests bring a schema never seen before (agents with their own
tools); xgrammar stays "auto"'s choice for repeated schemas and large batches.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch
from llguidance.gbnf_to_lark import gbnf_to_lark

from pagedllm.sampling_params import StructuredOutputsParams

# The same bound on whitespace runs as the xgrammar backend (see MAX_WHITESPACE_RUN there).
_WHITESPACE = "[\\x20\\x0A\\x0D\\x09]{0,20}"


def grammar_text(params: StructuredOutputsParams) -> str:
    """`params` as an llguidance grammar (no tokenizer needed).

    Raises:
        ValueError: naming the field when it is malformed, or for a structural tag (not
            available with this backend).
    """
    kind = params.kind
    if kind in ("json", "json_object"):
        schema = params.json if kind == "json" else {"type": "object"}
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
        defaults: Any = (  # llguidance's JsonCompileOptions (a TypedDict)
            {"whitespace_flexible": False} if params.disable_any_whitespace
            else {"whitespace_pattern": _WHITESPACE}
        )
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults=defaults)
        except Exception as exc:  # noqa: BLE001 - llguidance raises ValueError and others
            raise ValueError(f"Invalid structured_outputs.{kind}: {exc}") from None
    elif kind == "regex":
        assert params.regex is not None
        grammar = llguidance.LLMatcher.grammar_from_regex(params.regex)
    elif kind == "choice":
        assert params.choice is not None
        # Lark string literals take JSON's escapes.
        literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice)
        grammar = llguidance.LLMatcher.grammar_from_lark(f"start: {literals}")
    elif kind == "grammar":
        assert params.grammar is not None
        text = params.grammar
        try:
            lark = gbnf_to_lark(text) if "::=" in text else text
        except Exception as exc:  # noqa: BLE001 - the converter's own error types
            raise ValueError(f"Invalid structured_outputs.grammar: {exc}") from None
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    else:
        raise ValueError(
            "structured_outputs.structural_tag is not available with the guidance backend; "
            "use the xgrammar backend."
        )
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"Invalid structured_outputs.{kind}: {error.strip()}")
    return grammar


class GuidanceMatcher:
    """A request's llguidance matcher (see backend.GrammarMatcher)."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar)

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over `token_ids`; False at the first one the grammar does not allow."""
        return all(self._matcher.consume_token(token_id) for token_id in token_ids)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        self._matcher.rollback(num_tokens)

    def num_valid_tokens(self, token_ids: list[int]) -> int:
        """How many leading `token_ids` the grammar allows; the state is unchanged (a
        refused consume_token would leave the matcher in its error state)."""
        return int(self._matcher.validate_tokens(token_ids))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """The tokens allowed next, into `bitmask[row]`."""
        llguidance.torch.fill_next_token_bitmask(self._matcher, bitmask, row)

    def is_terminated(self) -> bool:
        """True once complete and the end-of-sequence token was accepted."""
        return bool(self._matcher.is_stopped())


class GuidanceBackend:
    """Checks constraints for one tokenizer (see backend.GrammarBackend); llguidance builds
    its parser lazily while matching, so "compiling" is parsing and validating the grammar.

    Stop tokens: llguidance ends a grammar with the tokenizer's end-of-sequence token; a
    request's extra `stop_token_ids` do not end it early.
    """

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def compile(self, params: StructuredOutputsParams) -> str:
        """The checked grammar text of `params`.

        Raises:
            ValueError: naming the field, when the constraint is malformed.
        """
        return grammar_text(params)

    def matcher(self, compiled: Any, stop_token_ids: list[int]) -> GuidanceMatcher:
        """A fresh matcher over the grammar `compiled`."""
        del stop_token_ids  # the tokenizer's EOS ends the grammar (see the class docstring)
        return GuidanceMatcher(self._tokenizer, compiled)

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """A [num_rows, ceil(vocab / 32)] int32 bitmask."""
        return torch.full((num_rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)
