"""Reasoning parsers (`--reasoning-parser`): split a reasoning model's reply into its
reasoning and its answer, whole or as a stream of deltas. The OpenAI server's chat endpoint
and `LLM.chat` use them to report the split, and structured outputs use them to constrain only
the answer (structured_output/reasoning_gate.py). This package calls no engine code.
"""

from __future__ import annotations

from pagedllm.reasoning.harmony import HarmonyReasoningParser
from pagedllm.reasoning.parsers import (
    TAG_PARSERS,
    ReasoningParser,
    ReasoningSplit,
    ReplyStreamer,
    TagReasoningParser,
)

_PARSERS: dict[str, ReasoningParser] = {parser.name: parser for parser in TAG_PARSERS}
_PARSERS["openai_gptoss"] = HarmonyReasoningParser()
_PARSERS["gpt_oss"] = HarmonyReasoningParser(name="gpt_oss")


def reasoning_parser_names() -> list[str]:
    """The names `--reasoning-parser` takes."""
    return sorted(_PARSERS)


def reasoning_parser_or_none(name: str | None) -> ReasoningParser | None:
    """The parser called `name`, or None when no parser is configured."""
    return get_reasoning_parser(name) if name else None


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser called `name`; ValueError naming the known ones otherwise."""
    try:
        return _PARSERS[name]
    except KeyError:
        raise ValueError(f"Unknown reasoning parser {name!r}; choose one of "
                         f"{', '.join(reasoning_parser_names())}.") from None


__all__ = [
    "HarmonyReasoningParser", "ReasoningParser", "ReasoningSplit", "ReplyStreamer",
    "TagReasoningParser", "get_reasoning_parser", "reasoning_parser_names",
    "reasoning_parser_or_none",
]
