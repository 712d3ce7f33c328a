"""Pooling of packed hidden states and the pooling config, as vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pagedllm.pooling.config import PoolerConfig, read_sentence_transformers
from pagedllm.pooling.pooler import finish_embedding, finish_scores, pool_hidden_states

SEQ_LENS = [3, 1, 5]


@pytest.fixture
def hidden() -> torch.Tensor:
    return torch.randn(sum(SEQ_LENS), 8, generator=torch.Generator().manual_seed(0))


def test_each_pooling_type_matches_the_padded_definition(hidden) -> None:
    parts = hidden.split(SEQ_LENS)
    for got, part in zip(pool_hidden_states(hidden, SEQ_LENS, "MEAN"), parts, strict=True):
        torch.testing.assert_close(got, part.mean(0))
    for got, part in zip(pool_hidden_states(hidden, SEQ_LENS, "CLS"), parts, strict=True):
        assert torch.equal(got, part[0])
    for got, part in zip(pool_hidden_states(hidden, SEQ_LENS, "LAST"), parts, strict=True):
        assert torch.equal(got, part[-1])
    for got, part in zip(pool_hidden_states(hidden, SEQ_LENS, "ALL"), parts, strict=True):
        assert torch.equal(got, part)


def test_step_pooling_keeps_the_step_tag_positions(hidden) -> None:
    ids = torch.tensor([1, 7, 2, 7, 3, 7, 4, 5, 7])
    steps = pool_hidden_states(hidden, SEQ_LENS, "STEP", input_ids=ids, step_tag_id=7)
    assert [len(s) for s in steps] == [1, 1, 2]
    assert torch.equal(steps[2], hidden[[5, 8]])
    with pytest.raises(ValueError, match="step_tag_id"):
        pool_hidden_states(hidden, SEQ_LENS, "STEP")


def test_matryoshka_dimensions_then_normalize() -> None:
    embedding = torch.tensor([3.0, 4.0, 12.0])
    got = finish_embedding(embedding, PoolerConfig(dimensions=2, normalize=True))
    torch.testing.assert_close(got, torch.tensor([0.6, 0.8]))
    assert torch.equal(finish_embedding(embedding, PoolerConfig()), embedding)
    with pytest.raises(ValueError, match="dimensions=4"):
        finish_embedding(embedding, PoolerConfig(dimensions=4))


def test_softmax_scores() -> None:
    logits = torch.tensor([[1.0, 2.0]])
    torch.testing.assert_close(finish_scores(logits, PoolerConfig(softmax=True)),
                               F.softmax(logits, -1))  # fmt: skip
    assert torch.equal(finish_scores(logits, PoolerConfig(softmax=False)), logits)


def test_config_validates_and_merges() -> None:
    assert PoolerConfig(pooling_type="mean").pooling_type == "MEAN"
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        PoolerConfig(pooling_type="MAX")
    with pytest.raises(ValueError, match="dimensions"):
        PoolerConfig(dimensions=0)
    merged = PoolerConfig(normalize=False).merged_over(PoolerConfig("CLS", normalize=True))
    assert (merged.pooling_type, merged.normalize) == ("CLS", False)


def _st_folder(tmp_path: Path, pooling: dict, normalize: bool) -> Path:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ]  # fmt: skip
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})  # fmt: skip
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return tmp_path


def test_sentence_transformers_folder(tmp_path: Path) -> None:
    folder = _st_folder(tmp_path, {"pooling_mode_mean_tokens": True}, normalize=True)
    setup = read_sentence_transformers(folder)
    assert setup is not None
    assert setup.pooler_config == PoolerConfig(pooling_type="MEAN", normalize=True)
    assert setup.max_seq_length == 128
    assert read_sentence_transformers(tmp_path / "1_Pooling") is None  # not such a folder


def test_unbuilt_sentence_transformers_pooling_mode_is_refused(tmp_path: Path) -> None:
    folder = _st_folder(tmp_path, {"pooling_mode_max_tokens": True}, normalize=False)
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        read_sentence_transformers(folder)
