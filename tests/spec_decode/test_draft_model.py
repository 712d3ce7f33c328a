"""A draft model with its own paged KV cache: greedy output unchanged in every batch layout,
every draft accepted when the draft is the target itself (so its KV is exactly right through
catch-up, lookahead slots, chunking and preemption), and sampled drafts verified by
rejection sampling keep the target's distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy import stats

from pagedllm import LLM, SamplingParams
from tests.conftest import make_tiny_model
from tests.entrypoints.test_spec_decode import (
    SETTINGS,
    _check_all_returned,
    _engine,
    _watch_block_tables,
)
from tests.spec_decode.conftest import PROMPTS


@pytest.fixture(scope="module")
def tiny_draft_dir(tmp_path_factory, tiny_tokenizer_dir):
    """A one-layer Qwen2 sharing the tiny Llama's tokenizer."""
    return make_tiny_model(
        tmp_path_factory.mktemp("draft"), tiny_tokenizer_dir, "qwen2", num_hidden_layers=1
    )


def _spec_llm(target, draft, k=3, **kwargs) -> LLM:
    kwargs.setdefault("dtype", "float32")
    llm = LLM(str(target),
              speculative_config={"model": str(draft), "num_speculative_tokens": k,
                                  "disable_by_batch_size": 1000},
              **kwargs)
    _watch_block_tables(llm)
    return llm


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=30)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_the_target_as_its_own_draft_is_always_accepted(tiny_llama_dir, plain_outputs, setting):
    llm = _spec_llm(tiny_llama_dir, tiny_llama_dir, **SETTINGS[setting])
    assert _greedy(llm) == plain_outputs
    counters = _engine(llm).scheduler.spec_counters
    assert counters.num_draft_tokens > 0
    assert counters.num_accepted_tokens == counters.num_draft_tokens
    if setting in ("recompute", "swap"):
        assert _engine(llm).scheduler.num_preemptions > 0
    _check_all_returned(llm)


def test_another_architecture_as_draft(tiny_llama_dir, tiny_draft_dir, plain_outputs):
    llm = _spec_llm(tiny_llama_dir, tiny_draft_dir, k=4, max_model_len=256)
    assert _greedy(llm) == plain_outputs
    for prompt, want in zip(PROMPTS, plain_outputs, strict=True):  # alone, too
        params = SamplingParams(temperature=0.0, max_tokens=30)
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        assert out[0].outputs[0].token_ids == want
    assert _engine(llm).scheduler.spec_counters.num_draft_tokens > 0
    _check_all_returned(llm)


def test_sampled_drafts_keep_the_target_distribution(tiny_llama_dir, tiny_draft_dir):
    """Chi-square over 20,000 second tokens: the draft (another model, so q != p) samples
    its drafts and the rejection sampler verifies them against its distribution."""
    params = SamplingParams(temperature=1.0, max_tokens=3, detokenize=False, ignore_eos=True)
    prompt = PROMPTS[0]
    num_samples = 20_000
    torch.manual_seed(20_000)  # the engine runs in this process: a reproducible draw
    counts = []
    for speculate in (False, True):
        kwargs = dict(dtype="float32", max_model_len=64, max_num_seqs=512,
                      max_num_batched_tokens=4096)
        if speculate:
            llm = _spec_llm(tiny_llama_dir, tiny_draft_dir, k=1, **kwargs)
        else:
            llm = LLM(str(tiny_llama_dir), **kwargs)
        outputs = llm.generate([{"prompt_token_ids": prompt}] * num_samples, params,
                               use_tqdm=False)
        counts.append(Counter(o.outputs[0].token_ids[1] for o in outputs))
        if speculate:
            counters = _engine(llm).scheduler.spec_counters
            assert counters.num_drafts == num_samples
            assert 0 < counters.num_accepted_tokens < num_samples
    head = [t for t in set(counts[0]) | set(counts[1]) if counts[0][t] + counts[1][t] >= 20]
    table = [[c[t] for t in head] + [sum(c.values()) - sum(c[t] for t in head)] for c in counts]
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    assert len(table[0]) > 2
    assert stats.chi2_contingency(table).pvalue > 0.01


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama_dir, tmp_path,
                                                    tiny_tokenizer_dir):
    other = make_tiny_model(tmp_path / "other", tiny_tokenizer_dir, "llama", vocab_size=300)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(str(tiny_llama_dir), speculative_config={"model": str(other)})


def test_a_draft_model_takes_the_cpu_decode_stack(tiny_llama_dir, monkeypatch, bf16_panels):
    """bfloat16 int4 on CPU: the draft model's steps of one token a row run in the one-call
    C decode stack over its own caches, as the target's decode steps do; the tokens are
    those of a run with the stack off (it is bit-identical to the layers). Panels for every
    step: on matrix units the engine with the stack would otherwise measure how far it
    serves (stack_reach.py) and multiply its larger steps as the other engine's layers do
    not."""
    bf16_panels("always")
    from pagedllm.worker.decode_step import cpu_stack
    from pagedllm.worker.step_hooks.spec_decode import SpecDecodeHook

    if cpu_stack._library() is None or not cpu_stack.cpu_platform().byte_dot_kernels(
        torch.bfloat16
    ):
        pytest.skip("no C kernels with W4A8 here")
    stacks: list[int] = []
    run = cpu_stack.CpuDecodeStack.run
    monkeypatch.setattr(cpu_stack.CpuDecodeStack, "run",
                        lambda self, batch: stacks.append(id(self)) or run(self, batch))
    kwargs = dict(dtype="bfloat16", quantization="int4", max_model_len=128)
    llm = _spec_llm(tiny_llama_dir, tiny_llama_dir, **kwargs)
    hook = _engine(llm).executor.worker.model_runner.hook(SpecDecodeHook)
    assert hook is not None and hook.proposer.decode_step is not None
    with_stack = _greedy(llm)
    assert len(set(stacks)) == 2  # the target's stack and the draft model's
    monkeypatch.setenv("PAGEDLLM_DECODE_STACK", "python")
    off = _spec_llm(tiny_llama_dir, tiny_llama_dir, **kwargs)
    assert _greedy(off) == with_stack
