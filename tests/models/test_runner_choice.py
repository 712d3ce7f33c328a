"""Which runner, class and pooling tasks a checkpoint's architecture gets (vLLM's rules)."""

from __future__ import annotations

import pytest

from pagedllm.models.bert import BertForSequenceClassification, BertModel, XLMRobertaModel
from pagedllm.models.llama import LlamaForCausalLM
from pagedllm.models.registry import resolve_runner


def test_auto_follows_the_architecture() -> None:
    choice = resolve_runner("BertModel")
    assert (choice.runner, choice.model_class, choice.supported_tasks) == (
        "pooling", BertModel, ("embed", "encode"))  # fmt: skip
    assert resolve_runner("XLMRobertaModel").model_class is XLMRobertaModel
    cross = resolve_runner("BertForSequenceClassification")
    assert (cross.model_class, cross.supported_tasks) == (
        BertForSequenceClassification, ("classify", "score"))  # fmt: skip
    reward = resolve_runner("LlamaForSequenceClassification")
    assert (reward.runner, reward.default_pooling_type) == ("pooling", "LAST")
    assert "reward" in reward.supported_tasks
    generate = resolve_runner("LlamaForCausalLM")
    assert (generate.runner, generate.model_class) == ("generate", LlamaForCausalLM)


def test_a_decoder_becomes_an_embedder() -> None:
    for kwargs in ({"runner": "pooling"}, {"convert": "embed"}):
        choice = resolve_runner("Qwen3ForCausalLM", **kwargs)
        assert (choice.runner, choice.supported_tasks, choice.default_pooling_type,
                choice.convert) == ("pooling", ("embed", "encode"), "LAST", "embed")  # fmt: skip


@pytest.mark.parametrize(
    ("architecture", "kwargs", "match"),
    [("BertModel", {"runner": "generate"}, "pooling model"),
     ("LlamaForCausalLM", {"convert": "classify"}, "no classification head"),
     ("LlamaForCausalLM", {"runner": "embed"}, "runner must be"),
     ("LlamaForCausalLM", {"convert": "reward"}, "convert must be"),
     ("T5ForConditionalGeneration", {}, "not supported")],
)  # fmt: skip
def test_errors_name_the_problem(architecture, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_runner(architecture, **kwargs)


@pytest.mark.parametrize("architecture", ["BertModel", "Qwen2ForSequenceClassification"])
def test_generating_registry_points_pooling_models_to_the_pooling_runner(architecture) -> None:
    from pagedllm.models.registry import resolve_model_class

    with pytest.raises(ValueError, match="is a pooling model.*runner='pooling'"):
        resolve_model_class(architecture)


def test_runner_generate_on_a_pooling_checkpoint_says_so(tmp_path) -> None:
    """A tiny BERT folder given to LLM with runner="generate": a ValueError naming it."""
    from transformers import BertConfig

    from pagedllm import LLM

    BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, architectures=["BertModel"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="BertModel is a pooling model"):
        LLM(str(tmp_path), runner="generate")


def test_generate_with_convert_embed_serves_both() -> None:
    choice = resolve_runner("LlamaForCausalLM", runner="generate", convert="embed")
    assert (choice.runner, choice.supported_tasks, choice.default_pooling_type) == (
        "generate", ("generate", "embed", "encode"), "LAST")  # fmt: skip
