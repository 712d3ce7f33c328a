"""The xgrammar backend (vLLM's default): JSON schema, regex, choice, EBNF/Lark grammars and
structural tags compiled against the model's tokenizer, matched token by token.

Parsing a constraint into an xgrammar Grammar needs no tokenizer and is fast, so the
frontend does it to reject malformed constraints before a request is queued (`parse`);
compiling it for the vocabulary (the expensive part) runs in the manager's threads.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
import xgrammar as xgr

from pagedllm.sampling_params import StructuredOutputsParams

# Longest run of whitespace between JSON tokens. Unbounded, a small model can keep choosing
# whitespace (the grammar allows it) until max_tokens and never close the object; 20 still
# lets pretty-printed JSON indent five levels of four spaces.
MAX_WHITESPACE_RUN = 20

# xgrammar logs its C++ source position in front of the message: keep the message.
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


def _error_text(exc: Exception) -> str:
    return _SOURCE_PREFIX.sub("", str(exc).strip())


def _choice_ebnf(choices: list[str]) -> str:
    # JSON string escapes are also EBNF string-literal escapes.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _schema_text(schema: str | dict) -> str:
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
        return schema
    return json.dumps(schema)


def _whitespace(params: StructuredOutputsParams) -> dict[str, Any]:
    if params.disable_any_whitespace:
        return {"any_whitespace": False}
    return {"any_whitespace": True, "max_whitespace_cnt": MAX_WHITESPACE_RUN}


def parse(params: StructuredOutputsParams) -> xgr.Grammar:
    """`params` as an xgrammar Grammar (no tokenizer needed).

    Raises:
        ValueError: naming the field (`structured_outputs.json` ...) when it is malformed.
    """
    kind = params.kind
    try:
        if kind == "json":
            assert params.json is not None
            return xgr.Grammar.from_json_schema(
                _schema_text(params.json), strict_mode=True, **_whitespace(params)
            )
        if kind == "json_object":  # OpenAI's json_object: an object, not any JSON value
            return xgr.Grammar.from_json_schema('{"type": "object"}', **_whitespace(params))
        if kind == "regex":
            assert params.regex is not None
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            assert params.choice is not None
            return xgr.Grammar.from_ebnf(_choice_ebnf(params.choice))
        if kind == "grammar":
            assert params.grammar is not None
            if "::=" in params.grammar:
                return xgr.Grammar.from_ebnf(params.grammar)
            return xgr.Grammar.from_lark(params.grammar)
        assert params.structural_tag is not None
        return xgr.Grammar.from_structural_tag(params.structural_tag)
    except ValueError:
        raise
    except Exception as exc:  # xgrammar raises RuntimeError (and a few of its own)
        raise ValueError(f"Invalid structured_outputs.{kind}: {_error_text(exc)}") from None


class XgrammarMatcher:
    """A request's xgrammar matcher (see backend.GrammarMatcher)."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: list[int]) -> None:
        # Rollback is unlimited (for speculative decoding's drafts).
        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids or None)

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over `token_ids`; False at the first one the grammar does not allow."""
        return all(self._matcher.accept_token(token_id) for token_id in token_ids)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        self._matcher.rollback(num_tokens)

    def num_valid_tokens(self, token_ids: list[int]) -> int:
        """How many leading `token_ids` the grammar allows (none after a stop token); the
        state is unchanged (a refused accept_token changes nothing)."""
        count = 0
        for token_id in token_ids:
            if self._matcher.is_terminated() or not self._matcher.accept_token(token_id):
                break
            count += 1
        if count:
            self._matcher.rollback(count)
        return count

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """The tokens allowed next, into `bitmask[row]`."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        """True once complete and a stop token was accepted."""
        return bool(self._matcher.is_terminated())


class XgrammarBackend:
    """Compiles constraints for one tokenizer (see backend.GrammarBackend).

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        vocab_size: the model's logits width (may exceed the tokenizer's: padding rows).
        num_threads: compiler threads per grammar.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, num_threads: int = 2) -> None:
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # Our manager keeps the cache of compiled grammars (keyed by the constraint).
        self._compiler = xgr.GrammarCompiler(info, max_threads=num_threads, cache_enabled=False)

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The compiled grammar of `params`.

        Raises:
            ValueError: naming the field, when the constraint is malformed.
        """
        grammar = parse(params)
        try:
            return self._compiler.compile_grammar(grammar)
        except Exception as exc:
            raise ValueError(
                f"Invalid structured_outputs.{params.kind}: {_error_text(exc)}"
            ) from None

    def matcher(self, compiled: Any, stop_token_ids: list[int]) -> XgrammarMatcher:
        """A fresh matcher over `compiled`."""
        return XgrammarMatcher(compiled, stop_token_ids)

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """A [num_rows, ceil(vocab / 32)] int32 bitmask."""
        return xgr.allocate_token_bitmask(num_rows, self.vocab_size)
