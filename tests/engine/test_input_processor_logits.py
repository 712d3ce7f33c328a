"""InputProcessor checks of vocabulary-bound fields and bad_words tokenization."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from pagedllm.engine.input_processor import InputProcessor
from pagedllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def processor(tiny_tokenizer_dir) -> InputProcessor:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    return InputProcessor(tokenizer, 128, len(tokenizer), tokenizer.eos_token_id)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"logit_bias": {10_000: 1.0}},
            r"token_id\(s\) \[10000\] in logit_bias contain out-of-vocab",
        ),
        ({"allowed_token_ids": [1, 10_000]}, "allowed_token_ids contains out-of-vocab token id!"),
        ({"stop_token_ids": [10_000]}, "in stop_token_ids contain out-of-vocab"),
    ],
)
def test_out_of_vocab_ids_rejected(processor, kwargs, message):
    with pytest.raises(ValueError, match=message):
        processor.process("r", "hello", SamplingParams(**kwargs))


def test_bad_words_tokenized_bare_and_after_space(processor):
    tokenizer = processor.tokenizer
    request, _ = processor.process("r", "hello", SamplingParams(bad_words=["fox", " quick"]))
    sequences = request.data.sampling_params.bad_words_token_ids
    bare = tokenizer.encode("fox", add_special_tokens=False)
    spaced = tokenizer.encode(" fox", add_special_tokens=False)
    assert bare in sequences
    # A leading space that merges into the word's token is a second form to ban.
    assert (spaced in sequences) == (len(spaced) == len(bare) and spaced[0] != bare[0])
    assert tokenizer.encode("quick", add_special_tokens=False) in sequences
