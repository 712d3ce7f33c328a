"""Logprobs and prompt logprobs of the whole engine against transformers' log_softmax.

The reference is one transformers forward pass over prompt + generated tokens on the same
tiny float32 checkpoint: position j's log_softmax scores token j + 1. Logprobs are the raw
distribution, so penalties and temperature must not change them.
"""

from __future__ import annotations

import random

import pytest
import torch

from pagedllm import LLM, LLMEngine, Logprob, RequestOutputKind, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.worker.step_hooks.prompt_logprobs import PromptLogprobsHook

ATOL = 1e-4


def _llm(model_dir, **kwargs) -> LLM:
    """A tiny engine with a small KV pool (fast to build)."""
    kwargs.setdefault("max_model_len", 128)
    kwargs.setdefault("num_gpu_blocks_override", 64)
    # Whole-vocabulary logprobs (-1) are asked for: vLLM's rule needs max_logprobs -1 then.
    kwargs.setdefault("max_logprobs", -1)
    return LLM(str(model_dir), dtype="float32", **kwargs)


@pytest.fixture(scope="module", params=["tiny_llama_dir", "tiny_qwen2_dir"])
def setup(request):
    from transformers import AutoModelForCausalLM

    model_dir = request.getfixturevalue(request.param)
    llm = _llm(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_dir, llm, reference


def _reference_logprobs(model, token_ids: list[int]) -> torch.Tensor:
    """[len - 1, V]: row j is the log-distribution of token j + 1."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def _check_position(entry: dict[int, Logprob], scored: int, ref_row: torch.Tensor, k: int):
    """One position's dict: the scored token, then the top-k, with ranks and logprobs."""
    assert next(iter(entry)) == scored
    assert abs(entry[scored].logprob - float(ref_row[scored])) < ATOL
    assert entry[scored].rank == int((ref_row > ref_row[scored]).sum()) + 1
    top_values, top_ids = ref_row.topk(k)
    assert set(entry) == {scored, *top_ids.tolist()}
    for rank, (token_id, value) in enumerate(
        zip(top_ids.tolist(), top_values.tolist(), strict=False), 1
    ):
        assert abs(entry[token_id].logprob - value) < ATOL
        if token_id != scored:
            assert entry[token_id].rank == rank


def _prompt(vocab_size: int, length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab_size) for _ in range(length)]


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 0.0},
        {"temperature": 0.9, "seed": 3, "top_k": 20},
        # Raw logprobs: penalties and bias change the choice, not the reported logprobs.
        {
            "temperature": 0.0,
            "repetition_penalty": 1.7,
            "presence_penalty": 1.0,
            "logit_bias": {5: 3.0},
        },
    ],
)
def test_sample_logprobs_match_transformers(setup, extra):
    _, llm, reference = setup
    tokenizer = llm.get_tokenizer()
    prompt = _prompt(reference.config.vocab_size, 11)
    params = SamplingParams(max_tokens=8, logprobs=4, ignore_eos=True, **extra)
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 8
    ref = _reference_logprobs(reference, prompt + out.token_ids)[len(prompt) - 1 :]
    for j, (token_id, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=False)):
        _check_position(entry, token_id, ref[j], 4)
        for tid, logprob in entry.items():
            assert logprob.decoded_token == tokenizer.decode([tid])
    expected_sum = sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs, strict=False))
    assert out.cumulative_logprob == pytest.approx(expected_sum, abs=1e-6)
    if extra["temperature"] == 0.0 and "logit_bias" not in extra:
        assert all(e[t].rank == 1 for t, e in zip(out.token_ids, out.logprobs, strict=False))


def test_prompt_logprobs_match_transformers(setup):
    _, llm, reference = setup
    prompt = _prompt(reference.config.vocab_size, 23, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3)
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None
    ref = _reference_logprobs(reference, prompt)
    for j in range(1, len(prompt)):
        _check_position(out.prompt_logprobs[j], prompt[j], ref[j - 1], 3)


def test_zero_and_full_vocab_logprobs(setup):
    _, llm, reference = setup
    vocab_size = reference.config.vocab_size
    prompt = _prompt(vocab_size, 5, seed=2)
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=0, prompt_logprobs=-1)
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    completion = out.outputs[0]
    assert [list(e) for e in completion.logprobs] == [[t] for t in completion.token_ids]
    assert all(len(e) == vocab_size for e in out.prompt_logprobs[1:])
    ref = _reference_logprobs(reference, prompt)
    got = torch.tensor([[out.prompt_logprobs[1][t].logprob for t in range(vocab_size)]])
    torch.testing.assert_close(got[0], ref[0], atol=ATOL, rtol=0)


def _engine_prompt_logprobs(llm: LLM, prompts: list[list[int]], k: int):
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=k, logprobs=k)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def _assert_outputs_equal(got, want):
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert x.keys() == y.keys()
            assert all(abs(x[t].logprob - y[t].logprob) < ATOL for t in x)
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert x.keys() == y.keys()


PROMPT_LENGTHS = (70, 33, 9, 50)
# 13 usable blocks of 8 tokens and 24 tokens a step: chunked prompts that get preempted.
SMALL_KV = dict(
    max_model_len=96, block_size=8, num_gpu_blocks_override=14, max_num_batched_tokens=24
)


@pytest.fixture(scope="module")
def reference_run(tiny_llama_dir):
    """Prompts and their outputs on an engine with room for everything (no chunking)."""
    prompts = [_prompt(300, n, seed=n) for n in PROMPT_LENGTHS]
    base = _llm(tiny_llama_dir)
    want = _engine_prompt_logprobs(base, prompts, 2)
    assert [len(o.prompt_logprobs) for o in want] == list(PROMPT_LENGTHS)
    return base, prompts, want


def test_chunked_prefill_and_prefix_cache(tiny_llama_dir, reference_run):
    base, prompts, want = reference_run
    chunked = _llm(tiny_llama_dir, max_num_batched_tokens=16)
    _assert_outputs_equal(_engine_prompt_logprobs(chunked, prompts, 2), want)
    # The same prompts again: their blocks are cached, yet every position is scored.
    _assert_outputs_equal(_engine_prompt_logprobs(base, prompts, 2), want)


def test_recompute_preemption(tiny_llama_dir, reference_run):
    _, prompts, want = reference_run
    small = _llm(tiny_llama_dir, **SMALL_KV)
    _assert_outputs_equal(_engine_prompt_logprobs(small, prompts, 2), want)
    assert small.llm_engine.engine_core.engine_core.scheduler.num_preemptions > 0


def test_swap_preemption_resumes_prompt_logprobs(tiny_llama_dir, reference_run, monkeypatch):
    _, prompts, want = reference_run
    swap = _llm(tiny_llama_dir, preemption_mode="swap", swap_space=0.01, **SMALL_KV)
    core = swap.llm_engine.engine_core.engine_core
    hook = core.executor.worker.model_runner.hook(PromptLogprobsHook)
    assert isinstance(hook, PromptLogprobsHook)
    resumed = []
    add_request = hook.add_request

    def spy(state, new):
        was_parked = new.request_id in hook.parked
        add_request(state, new)
        accumulated = state.in_progress_prompt_logprobs
        resumed.append(was_parked and accumulated is not None and len(accumulated) > 0)

    monkeypatch.setattr(hook, "add_request", spy)
    _assert_outputs_equal(_engine_prompt_logprobs(swap, prompts, 2), want)
    assert any(resumed), "no request was swapped out mid-prompt"
    assert not hook.parked


def test_delta_outputs_split_logprobs(tiny_llama_dir):
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(tiny_llama_dir),
            dtype="float32",
            max_model_len=128,
            num_gpu_blocks_override=64,
        )
    )
    params = SamplingParams(
        temperature=0.0,
        max_tokens=5,
        logprobs=1,
        prompt_logprobs=1,
        output_kind=RequestOutputKind.DELTA,
    )
    engine.add_request("d", {"prompt_token_ids": _prompt(300, 6)}, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    assert outputs[0].prompt_logprobs is not None and len(outputs[0].prompt_logprobs) == 6
    assert all(o.prompt_logprobs is None for o in outputs[1:])
    assert all(len(o.outputs[0].logprobs) == len(o.outputs[0].token_ids) for o in outputs)
    sums = [
        sum(
            e[t].logprob
            for t, e in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=False)
        )
        for o in outputs
    ]
    assert outputs[-1].outputs[0].cumulative_logprob == pytest.approx(sum(sums), abs=1e-6)


def test_best_of_returns_the_n_most_likely(tiny_llama_dir):
    llm = _llm(tiny_llama_dir)
    prompt = {"prompt_token_ids": _prompt(300, 7)}
    common = dict(temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    all_four = llm.generate(prompt, SamplingParams(n=4, logprobs=0, **common), use_tqdm=False)
    best = llm.generate(prompt, SamplingParams(n=2, best_of=4, **common), use_tqdm=False)[0]
    ranked = sorted(all_four[0].outputs, key=lambda c: c.cumulative_logprob, reverse=True)
    assert [c.token_ids for c in best.outputs] == [c.token_ids for c in ranked[:2]]
    assert [c.index for c in best.outputs] == [0, 1]
    assert best.outputs[0].logprobs is None  # not asked for, only used to rank
    assert best.outputs[0].cumulative_logprob == pytest.approx(ranked[0].cumulative_logprob)
