"""Engine logprobs → the two OpenAI logprobs shapes (legacy completions, chat).

The engine reports, per generated token, a dict token_id → Logprob (`logprob`, `rank`,
`decoded_token`). Completions want parallel lists (tokens, token_logprobs, top_logprobs,
text_offset); chat wants one object per token with its top alternatives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pagedllm.entrypoints.openai.protocol import (
    ChatLogprobs,
    ChatLogprobToken,
    CompletionLogProbs,
    TopLogprob,
)

# One position: token_id → Logprob-like object (or None for the first prompt position).
PositionLogprobs = dict[int, Any] | None


def _token_text(tokenizer: Any, token_id: int, entry: Any, as_token_id: bool = False) -> str:
    if as_token_id:  # vLLM's return_tokens_as_token_ids: ids survive any detokenization
        return f"token_id:{token_id}"
    text = getattr(entry, "decoded_token", None)
    if text is None:
        text = tokenizer.decode([token_id])
    return str(text)


def _value(entry: Any) -> float:
    value = float(getattr(entry, "logprob", entry))
    # JSON has no -inf; OpenAI clients expect a very negative number.
    return max(value, -9999.0) if not math.isnan(value) else -9999.0


def _top(position: dict[int, Any], num_top: int) -> list[tuple[int, Any]]:
    ranked = sorted(position.items(), key=lambda kv: getattr(kv[1], "rank", None) or 0)
    if any(getattr(e, "rank", None) is None for _, e in ranked):
        ranked = sorted(position.items(), key=lambda kv: -_value(kv[1]))
    return ranked[:num_top] if num_top >= 0 else ranked


def completion_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[PositionLogprobs],
    num_top: int,
    tokenizer: Any,
    initial_offset: int = 0,
    as_token_ids: bool = False,
) -> CompletionLogProbs:
    """Legacy completions logprobs for `token_ids` (a None position has no logprob). Each
    position's top_logprobs holds the chosen token first, then the top `num_top` (vLLM's
    shape: `logprobs: 0` gives the chosen token alone)."""
    result = CompletionLogProbs()
    offset = initial_offset
    for token_id, position in zip(token_ids, logprobs, strict=True):
        if position is None:
            text = (f"token_id:{token_id}" if as_token_ids
                    else tokenizer.decode([token_id]))
            result.tokens.append(text)
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
        else:
            entry = position.get(token_id)
            text = _token_text(tokenizer, token_id, entry, as_token_ids)
            result.tokens.append(text)
            result.token_logprobs.append(_value(entry) if entry is not None else None)
            chosen = [(token_id, entry)] if entry is not None else []
            result.top_logprobs.append({
                _token_text(tokenizer, t, e, as_token_ids): _value(e)
                for t, e in chosen + _top(position, num_top)
            })
        result.text_offset.append(offset)
        offset += len(text)
    return result


def chat_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[PositionLogprobs], num_top: int, tokenizer: Any,
    as_token_ids: bool = False,
) -> ChatLogprobs:
    """Chat logprobs for `token_ids`."""
    content = []
    for token_id, position in zip(token_ids, logprobs, strict=True):
        position = position or {}
        entry = position.get(token_id)
        text = _token_text(tokenizer, token_id, entry, as_token_ids)
        top = [
            TopLogprob(token=(t := _token_text(tokenizer, tid, e, as_token_ids)),
                       logprob=_value(e),
                       bytes=list(t.encode("utf-8")))
            for tid, e in _top(position, num_top)
        ] if num_top else []
        content.append(ChatLogprobToken(
            token=text,
            logprob=_value(entry) if entry is not None else -9999.0,
            bytes=list(text.encode("utf-8")),
            top_logprobs=top,
        ))
    return ChatLogprobs(content=content)


def align(token_ids: Sequence[int], logprobs: Sequence[PositionLogprobs] | None) -> list:
    """The logprobs entries that belong to `token_ids` (the last len(token_ids) of them)."""
    if not logprobs:
        return [None] * len(token_ids)
    entries = list(logprobs)[-len(token_ids):] if token_ids else []
    return [None] * (len(token_ids) - len(entries)) + entries
