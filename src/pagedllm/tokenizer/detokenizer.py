"""Incremental detokenization and stop-string matching for one output sequence.

Responsibility: turn a stream of sampled token ids into a stream of text pieces whose
concatenation equals `tokenizer.decode(output_ids)` (holding back pieces that end in an
incomplete UTF-8 character), find stop strings in the growing text, and hold back the tail
that might still become a stop string while streaming.

Must not: import the engine or the core, touch torch, or decode the whole output on every
step. Text lives in the frontend; the core only ever sees token ids.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from pagedllm.sampling_params import SamplingParams

# What a decoder emits for an incomplete (or invalid) UTF-8 byte sequence.
REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded in front of the output, so that the first output token is decoded
# in context (a SentencePiece leading space survives; a byte-level split char is rejoined).
_CONTEXT_TOKENS = 6
# Tokens before the read window are dropped once this many pile up, to keep memory flat.
_TRIM_TOKENS = 256


class _TokenCodec:
    """The tokenizer operations the detokenizer needs, bound once per tokenizer.

    For a Rust-backed tokenizer these are the backend's own calls, so "special" means
    exactly what `decode(..., skip_special_tokens=True)` skips there.
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = tokenizer if isinstance(tokenizer, Tokenizer) else None
        backend = backend or getattr(tokenizer, "backend_tokenizer", None)
        self.backend: Tokenizer | None = backend
        if backend is not None:
            added = backend.get_added_tokens_decoder()
            self.special_ids = frozenset(i for i, token in added.items() if token.special)
            self.id_to_token = backend.id_to_token
            decoder = backend.decoder
            self.tokens_to_string = decoder.decode if decoder is not None else " ".join
        else:
            self.special_ids = frozenset(tokenizer.all_special_ids)
            self.id_to_token = tokenizer.convert_ids_to_tokens
            self.tokens_to_string = tokenizer.convert_tokens_to_string

    def to_tokens(self, token_ids: list[int], skip_special_tokens: bool) -> list[str]:
        """Token strings of `token_ids`, without special (when skipped) or unknown ids."""
        skip = self.special_ids if skip_special_tokens else frozenset()
        tokens = (self.id_to_token(i) for i in token_ids if i not in skip)
        return [token for token in tokens if token is not None]


@lru_cache(maxsize=16)
def _codec_for(tokenizer: Any) -> _TokenCodec:
    # Listing added tokens costs milliseconds for large vocabularies; do it once per tokenizer.
    return _TokenCodec(tokenizer)


class _OffsetDecoder:
    """The offset algorithm over token strings.

    Keeps every token string from a little prompt context on. `prefix_offset..read_offset` is
    the window already emitted; each step decodes `tokens[prefix_offset:read_offset]` and
    `tokens[prefix_offset:]` and emits the difference. Both decodes start at the same token,
    so whatever the decoder does to a sequence's first token (strip a SentencePiece space,
    replace a partial byte) cancels out. A text ending in U+FFFD is an incomplete character:
    nothing is emitted and the window grows until the character completes.
    """

    def __init__(self, codec: _TokenCodec, context_ids: list[int], skip_special_tokens: bool):
        self._codec = codec
        self._skip_special_tokens = skip_special_tokens
        context = codec.to_tokens(context_ids, skip_special_tokens)[-_CONTEXT_TOKENS:]
        self._tokens: list[str] = context
        self._prefix_offset = 0
        self._read_offset = len(context)

    def step(self, token_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (maybe "")."""
        self._tokens.extend(self._codec.to_tokens(token_ids, self._skip_special_tokens))
        return self._emit(is_final=False)

    def flush(self) -> str:
        """Emit whatever is held back, incomplete characters included (as U+FFFD)."""
        return self._emit(is_final=True)

    def _emit(self, is_final: bool) -> str:
        if self._read_offset == len(self._tokens):
            return ""
        to_string = self._codec.tokens_to_string
        prefix_text = to_string(self._tokens[self._prefix_offset : self._read_offset])
        text = to_string(self._tokens[self._prefix_offset :])
        if len(text) <= len(prefix_text) or (not is_final and text.endswith(REPLACEMENT_CHAR)):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        if self._prefix_offset > _TRIM_TOKENS:
            del self._tokens[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return text[len(prefix_text) :]


class _StreamDecoder:
    """Fast path: `tokenizers.decoders.DecodeStream`, the same offset idea inside Rust.

    It cannot flush held-back bytes and may reject an unusual decoder ("invalid prefix"), so
    it remembers the ids since its last emitted piece and hands them to an `_OffsetDecoder`
    for those cases. Every piece it emits ends on a complete character, so that hand-over
    point is always a clean boundary and the replayed text continues exactly.
    """

    def __init__(self, codec: _TokenCodec, context_ids: list[int], skip_special_tokens: bool):
        assert codec.backend is not None
        self._codec = codec
        self._backend = codec.backend
        self._skip_special_tokens = skip_special_tokens
        context = context_ids[-_CONTEXT_TOKENS:]
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
        # Ids already emitted (kept as decoding context) followed by the pending ones.
        self._ids: list[int] = list(context)
        self._num_emitted_ids = len(context)
        self._fallback: _OffsetDecoder | None = None
        if context and _ends_inside_a_character(codec, context, skip_special_tokens):
            # DecodeStream diffs against the context's text, U+FFFD included: an output
            # token that completes that character would bring the context's own last
            # characters into the output. The offset algorithm holds them back.
            self._fallback = _OffsetDecoder(codec, context, skip_special_tokens)

    def step(self, token_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (maybe "")."""
        if self._fallback is not None:
            return self._fallback.step(token_ids)
        self._ids.extend(token_ids)
        try:
            piece = self._stream.step(self._backend, token_ids)
        except Exception:  # the Rust side raises a bare Exception; replay exactly instead
            return self._replay_pending()
        if piece is None:
            return ""
        del self._ids[:-_CONTEXT_TOKENS]
        self._num_emitted_ids = len(self._ids)
        return piece

    def flush(self) -> str:
        """Emit whatever is held back, incomplete characters included (as U+FFFD)."""
        if self._fallback is not None:
            return self._fallback.flush()
        if self._num_emitted_ids == len(self._ids):
            return ""
        piece = self._replay_pending()
        assert self._fallback is not None
        return piece + self._fallback.flush()

    def _replay_pending(self) -> str:
        """Switch to the offset algorithm, starting at the last emitted boundary."""
        emitted = self._ids[: self._num_emitted_ids]
        pending = self._ids[self._num_emitted_ids :]
        self._fallback = _OffsetDecoder(self._codec, emitted, self._skip_special_tokens)
        return self._fallback.step(pending)


def _ends_inside_a_character(codec: _TokenCodec, ids: list[int], skip_special: bool) -> bool:
    """Whether `ids` decode to a text ending in an incomplete character (U+FFFD)."""
    return codec.tokens_to_string(codec.to_tokens(ids, skip_special)).endswith(REPLACEMENT_CHAR)


class IncrementalDetokenizer:
    """Detokenizes one output sequence as its tokens arrive.

    The concatenation of everything `add_tokens` and `flush` return equals
    `tokenizer.decode(prompt + output)[len(decode(prompt)):]`, which for byte-level BPE is
    `tokenizer.decode(output)`. With SentencePiece the first output token keeps its leading
    space, as it would in the full text. No piece ends inside a multi-byte character.

    Args:
        tokenizer: a transformers tokenizer or a `tokenizers.Tokenizer`.
        prompt_token_ids: the prompt; only its last few tokens are kept, as context.
        skip_special_tokens: drop special tokens, as `decode(skip_special_tokens=True)` does.
        spaces_between_special_tokens: accepted for vLLM compatibility. transformers 5 decodes
            without inserting spaces around special tokens, so being exact means ignoring it.
        use_decode_stream: use the `DecodeStream` fast path (Rust-backed tokenizers only);
            None picks it when available.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        use_decode_stream: bool | None = None,
    ) -> None:
        codec = _codec_for(tokenizer)
        if use_decode_stream is None:
            use_decode_stream = codec.backend is not None
        if use_decode_stream and codec.backend is None:
            raise ValueError("use_decode_stream needs a tokenizer backed by `tokenizers`.")
        decoder_cls = _StreamDecoder if use_decode_stream else _OffsetDecoder
        self._decoder = decoder_cls(codec, list(prompt_token_ids), skip_special_tokens)
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self._output_token_ids: list[int] = []
        self._output_text = ""

    def add_tokens(self, new_token_ids: list[int]) -> str:
        """Append sampled token ids; return the text they complete (maybe "")."""
        self._output_token_ids.extend(new_token_ids)
        piece = self._decoder.step(list(new_token_ids))
        self._output_text += piece
        return piece

    def flush(self) -> str:
        """At the end of the sequence, emit held-back text (an incomplete char as U+FFFD)."""
        piece = self._decoder.flush()
        self._output_text += piece
        return piece

    @property
    def output_text(self) -> str:
        """All text emitted so far."""
        return self._output_text

    @property
    def output_token_ids(self) -> list[int]:
        """All token ids added so far."""
        return self._output_token_ids


def check_stop_strings(
    output_text: str,
    new_char_count: int,
    stop: list[str],
    include_stop_str_in_output: bool,
) -> tuple[str, int] | None:
    """Find a stop string that ends within the last `new_char_count` chars of `output_text`.

    Only the new text plus `len(stop_str) - 1` chars before it are searched: older text was
    searched on earlier calls. When several stop strings match, the one that completes first
    wins (then the one that starts first), as if the text had arrived one char at a time.

    Returns:
        (the matched stop string, the length to truncate `output_text` to), where the
        truncated text excludes the stop string unless `include_stop_str_in_output`; None if
        nothing matches.
    """
    if new_char_count <= 0 or not stop:
        return None
    text_len = len(output_text)
    best: tuple[int, int, str] | None = None  # (end, start, stop string)
    for stop_str in stop:
        start = output_text.find(stop_str, max(0, text_len - new_char_count - len(stop_str) + 1))
        if start == -1:
            continue
        candidate = (start + len(stop_str), start, stop_str)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    if best is None:
        return None
    end, start, stop_str = best
    return stop_str, end if include_stop_str_in_output else start


class TextState:
    """The text side of one request's output: detokenize, stop strings, streaming hold-back.

    While the request runs, the last `params.output_text_buffer_length` chars are not shown:
    they might be the start of a stop string that must not appear in the output. Independent
    of the engine: the output processor feeds it token ids and reads text back.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams):
        self._params = params
        self._stop: list[str] = list(params.stop or [])  # type: ignore[arg-type]
        self._detokenizer = (
            IncrementalDetokenizer(
                tokenizer,
                prompt_token_ids,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
            if params.detokenize
            else None
        )
        self._text = ""  # decoded text, cut at the stop string once one matched
        self._num_output_tokens = 0
        self._num_sent_chars = 0  # chars already returned as DELTA output
        self.is_finished = False
        self.stop_string: str | None = None

    @property
    def has_stop_strings(self) -> bool:
        """True when the request has stop strings to match."""
        return bool(self._stop)

    def update(self, new_token_ids: list[int], finished: bool) -> str | None:
        """Add sampled tokens; return the stop string if one just matched (then finished).

        Args:
            new_token_ids: the tokens sampled for this request this step.
            finished: the core finished the request (EOS, length, stop id, abort).
        """
        assert not self.is_finished, "update() after the request finished"
        self._num_output_tokens += len(new_token_ids)
        if self._detokenizer is not None:
            new_text = self._detokenizer.add_tokens(new_token_ids)
            if finished:
                new_text += self._detokenizer.flush()
            self._text += new_text
            # vLLM semantics: stop strings only count once min_tokens have been generated.
            if self._stop and self._num_output_tokens > self._params.min_tokens:
                match = check_stop_strings(
                    self._text, len(new_text), self._stop, self._params.include_stop_str_in_output
                )
                if match is not None:
                    self.stop_string, truncate_to = match
                    self._text = self._text[:truncate_to]
                    finished = True
        self.is_finished = finished
        return self.stop_string

    @property
    def output_text(self) -> str:
        """All decoded text so far (cut at the stop string), hold-back included."""
        return self._text

    def get_output_text(self, delta: bool) -> str:
        """Text to show now: all of it (CUMULATIVE) or only what is new since the last call."""
        visible = len(self._text)
        if not self.is_finished:
            visible = max(visible - self._params.output_text_buffer_length, 0)
        if not delta:
            return self._text[:visible]
        # The visible length never shrinks: a stop string starts after any shown text.
        piece = self._text[self._num_sent_chars : visible]
        self._num_sent_chars = max(self._num_sent_chars, visible)
        return piece
