"""The reasoning gate: a constrained request's grammar waits while the reply reasons and
holds every token after the reasoning's end marker, also over draft tokens that cross it
(look-ahead with a copy of the gate; the gate itself never moves on drafts)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output import StructuredOutputManager
from pagedllm.structured_output.bitmask import allowed_tokens

CHOICES = ["yes", "no"]


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tokenizer.add_tokens(["<think>", "</think>"])
    return tokenizer


@pytest.fixture(scope="module")
def manager(tokenizer):
    manager = StructuredOutputManager(lambda: tokenizer, len(tokenizer),
                                      reasoning_parser="deepseek_r1")
    yield manager
    manager.shutdown()


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _grammar(manager, tokenizer, prompt="User: hi\nAssistant: <think>\n"):
    grammar = manager.grammar_for(StructuredOutputsParams(choice=CHOICES),
                                  [tokenizer.eos_token_id], _ids(tokenizer, prompt))
    grammar._compiled.result(timeout=60)
    return grammar


def test_reasoning_is_free_and_the_answer_is_held(manager, tokenizer):
    grammar = _grammar(manager, tokenizer)
    end = tokenizer.convert_tokens_to_ids("</think>")
    reasoning = _ids(tokenizer, "let me think")
    # While reasoning: every token allowed, nothing refused, never terminated.
    assert allowed_tokens(manager.grammar_bitmask([grammar]), manager.vocab_size).all()
    assert grammar.accept_tokens(reasoning) and not grammar.is_terminated()
    assert grammar.accept_tokens([end])  # the end marker itself is free
    allowed = allowed_tokens(manager.grammar_bitmask([grammar]), manager.vocab_size)[0]
    first_tokens = {_ids(tokenizer, choice)[0] for choice in CHOICES}
    assert set(torch.nonzero(allowed).flatten().tolist()) <= first_tokens
    assert not grammar.accept_tokens(_ids(tokenizer, "maybe")[:1])  # the grammar now holds


def test_drafts_crossing_the_end_marker_are_checked_after_it(manager, tokenizer):
    grammar = _grammar(manager, tokenizer)
    end = tokenizer.convert_tokens_to_ids("</think>")
    thought = _ids(tokenizer, "ok")
    yes, maybe = _ids(tokenizer, "yes"), _ids(tokenizer, "maybe")
    # Reasoning drafts and the end marker pass; after it, only what the choice allows.
    assert grammar.num_valid_tokens([*thought, end, *yes]) == len(thought) + 1 + len(yes)
    assert grammar.num_valid_tokens([*thought, end, *maybe]) == len(thought) + 1
    # The rows: free up to the marker, then the grammar's (nothing moved the gate).
    drafts = [*thought, end, *yes[:1]]
    rows = allowed_tokens(manager.grammar_bitmask([grammar], [drafts]), manager.vocab_size)
    assert rows[: len(thought) + 1].all()
    assert not rows[len(thought) + 1].all() and rows[len(thought) + 1, yes[0]]
    assert grammar.gate is not None and not grammar.gate.in_answer


def test_prompt_that_closed_the_reasoning_holds_from_the_first_token(manager, tokenizer):
    grammar = _grammar(manager, tokenizer, prompt="Assistant: <think>done</think>")
    assert grammar.gate is not None and grammar.gate.in_answer
    row = allowed_tokens(manager.grammar_bitmask([grammar]), manager.vocab_size)[0]
    assert not row.all()
    assert not grammar.accept_tokens(_ids(tokenizer, "let")[:1])


def test_enable_in_reasoning_constrains_everything(tokenizer):
    manager = StructuredOutputManager(lambda: tokenizer, len(tokenizer),
                                      reasoning_parser="deepseek_r1", enable_in_reasoning=True)
    try:
        grammar = _grammar(manager, tokenizer)
        assert grammar.gate is None
        assert not allowed_tokens(manager.grammar_bitmask([grammar]), manager.vocab_size).all()
    finally:
        manager.shutdown()
