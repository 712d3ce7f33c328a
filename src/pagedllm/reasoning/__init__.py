"""Reasoning parsers (`--reasoning-parser`): split a reasoning model's reply into its
reasoning (`<think>…</think>`) and its answer, whole or as a stream of deltas. Used by the
OpenAI server's chat endpoint; it calls no engine code.
"""

from pagedllm.reasoning.parsers import (
    ReasoningParser,
    ReasoningSplit,
    ReasoningStreamer,
    get_reasoning_parser,
    reasoning_parser_names,
)

__all__ = [
    "ReasoningParser", "ReasoningSplit", "ReasoningStreamer", "get_reasoning_parser",
    "reasoning_parser_names",
]
