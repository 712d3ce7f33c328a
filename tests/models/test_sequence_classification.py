"""Decoder classifiers and reward models: scores of packed sequences equal transformers'
`*ForSequenceClassification` run on each sequence alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pagedllm.models.sequence_classification import classifier_class

from .test_model_parity import _COMMON, PagedRunner, _tokens


def _config(arch: str, num_labels: int):
    import transformers as tf

    common = {**_COMMON, "num_labels": num_labels, "pad_token_id": 0}
    if arch == "Qwen2ForSequenceClassification":
        return tf.Qwen2Config(**common)
    return tf.LlamaConfig(**common)


@pytest.mark.parametrize(
    ("arch", "num_labels"),
    [("Qwen2ForSequenceClassification", 3), ("LlamaForSequenceClassification", 1)],
    ids=["qwen2-classifier", "llama-reward"],
)
def test_scores_equal_transformers(tmp_path: Path, arch: str, num_labels: int) -> None:
    import transformers as tf

    config = _config(arch, num_labels)
    torch.manual_seed(0)
    theirs = getattr(tf, arch)(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = classifier_class(arch)(config).eval()
    loaded = ours.load_weights(load_file(tmp_path / "model.safetensors").items())
    assert loaded == {name for name, _ in ours.named_parameters()}
    sequences = [_tokens(config.vocab_size, n, seed=n) for n in (5, 12, 1)]
    runner = PagedRunner(ours, (ours.spec.num_layers, ours.spec.num_kv_heads, ours.spec.head_dim))
    per_token = runner.step([(f"r{i}", s) for i, s in enumerate(sequences)])
    for sequence, scores in zip(sequences, per_token, strict=True):
        with torch.no_grad():
            want = theirs(torch.tensor([sequence])).logits[0]
        assert scores.shape == (len(sequence), num_labels)
        torch.testing.assert_close(scores[-1], want, atol=1e-4, rtol=1e-4)
    hidden = torch.randn(sum(map(len, sequences)), ours.spec.hidden_size)
    lens = [len(s) for s in sequences]
    ends = torch.tensor(lens).cumsum(0) - 1
    torch.testing.assert_close(ours.classify(hidden, lens), ours.compute_logits(hidden[ends]))


def test_unknown_classifier_architecture() -> None:
    with pytest.raises(ValueError, match="GPT2ForSequenceClassification"):
        classifier_class("GPT2ForSequenceClassification")
