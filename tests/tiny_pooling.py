"""Tiny pooling checkpoints for engine tests (their fixtures are in conftest.py): a BERT
with its own WordPiece tokenizer (pairs get token types), and decoder classifiers and reward
models with the tiny BPE tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

_TEXT = (
    "the a cat dog sat on mat paged attention keeps keys and values in blocks what "
    "is capital of france paris berlin embeddings retrieval query document relevant "
    "continuous batching new requests join every step hello world"
)
_WORDS = _TEXT.split()


def make_tiny_bert_dir(out_dir: Path, architecture: str = "BertModel", **config) -> Path:
    """A tiny random BERT (`architecture`: BertModel or BertForSequenceClassification)
    with a WordPiece tokenizer of a few words and every lowercase letter."""
    import transformers as tf

    out_dir.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "?", ".", ",", *letters,
             *[f"##{c}" for c in letters], *_WORDS]  # fmt: skip
    (out_dir / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = tf.BertTokenizerFast(str(out_dir / "vocab.txt"))
    tokenizer.save_pretrained(out_dir)
    bert_config = tf.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, **config,
    )  # fmt: skip
    torch.manual_seed(0)
    getattr(tf, architecture)(bert_config).eval().save_pretrained(out_dir)
    return out_dir


def make_tiny_decoder_dir(out_dir: Path, tokenizer_dir: Path, architecture: str, **config) -> Path:
    """A tiny random decoder checkpoint of `architecture` (a *ForSequenceClassification or a
    causal LM) with the tiny BPE tokenizer."""
    import transformers as tf

    from .conftest import _COMMON_TINY_DECODER

    tokenizer = tf.AutoTokenizer.from_pretrained(tokenizer_dir)
    family = "Qwen2" if architecture.startswith("Qwen2") else "Llama"
    hf_config = getattr(tf, f"{family}Config")(
        **_COMMON_TINY_DECODER, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **config,
    )  # fmt: skip
    torch.manual_seed(0)
    getattr(tf, architecture)(hf_config).eval().save_pretrained(out_dir)
    for path in Path(tokenizer_dir).iterdir():
        shutil.copy(path, out_dir / path.name)
    return out_dir
