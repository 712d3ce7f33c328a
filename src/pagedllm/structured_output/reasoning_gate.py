"""Constraining only the answer: a constrained request's grammar waits while its reply
reasons (vLLM's structured outputs with a reasoning parser, `enable_in_reasoning` off).

The gate reads the reply token by token with the reasoning parser's own streamer (so the
engine and the server split a reply at the same place) and opens once the reply reaches its
answer: the token that completes the end marker is the last free one, and the grammar
constrains every token after it. When the prompt already closed the reasoning (Qwen3's
`enable_thinking: false`), the gate is open from the first token. A reply that never opens
its reasoning where the parser needs an opening marker (Qwen3 answering without `<think>`)
opens the gate at the first token that tells so; the tokens before it were free.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from pagedllm.reasoning import ReasoningParser, ReplyStreamer

# Tokens of context decoded before a new one, so its text comes out as in the full reply
# (a space a tokenizer drops at the start of a text; bytes of a split character).
_CONTEXT_TOKENS = 6


class ReasoningGate:
    """Tells, token by token, whether a reply has reached its answer.

    Args:
        parser: the engine's reasoning parser.
        decode: token ids -> text, special tokens kept (the markers may be special tokens).
        answer_from_start: the prompt closed the reasoning.
    """

    def __init__(self, parser: ReasoningParser, decode: Callable[[list[int]], str],
                 answer_from_start: bool) -> None:
        self._decode = decode
        self._streamer: ReplyStreamer = parser.streamer(answer_from_start)
        self._tail: list[int] = []  # the last few reply tokens, for decoding the next

    @property
    def in_answer(self) -> bool:
        """True once the grammar applies (to every later token)."""
        return self._streamer.in_answer

    def feed(self, token_id: int) -> None:
        """One more reply token (sampled while the gate was closed)."""
        context = self._tail
        before = self._decode(context) if context else ""
        text = self._decode([*context, token_id])
        delta = text[len(before):] if text.startswith(before) else text
        self._streamer.feed(delta)
        self._tail = [*context, token_id][-_CONTEXT_TOKENS:]

    def clone(self) -> ReasoningGate:
        """An independent copy (to look ahead over draft tokens)."""
        twin = copy.copy(self)
        twin._streamer = copy.deepcopy(self._streamer)
        twin._tail = list(self._tail)
        return twin
