"""benchmarks/accuracy.py's truncated chat set equals the one built with shorter answers
from the same greedy float32 reference (the accuracy tests derive the 32-token set from
the 128-token one instead of running float32 twice): the same texts and top-1 tokens, and
the same logprobs up to float32 summation order (the second build reads its prompts from
the prefix cache)."""

from __future__ import annotations

from tests.conftest import load_benchmark


def test_truncated_chat_set_equals_a_shorter_build(tiny_llama_dir):
    accuracy = load_benchmark("accuracy")
    llm = accuracy.make_llm(str(tiny_llama_dir), accuracy.Mode("float32"), seed=0)
    long_chat, long_scores = accuracy.build_chat_set(llm, 12)
    short_chat, short_scores = accuracy.build_chat_set(llm, 5)
    chat, scores = accuracy.truncate_chat_set(long_chat, long_scores, 5)
    assert chat == short_chat
    assert scores.top1 == short_scores.top1
    for got, want in ((scores.actual_logprob, short_scores.actual_logprob),
                      (scores.margin, short_scores.margin)):
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
    assert len(scores.top1) == 5 * len(accuracy.CHAT_QUESTIONS)
