"""Speculative decoding end to end: the same tokens as without it, sooner.

Greedy output with n-gram drafts, and with an oracle proposer that proposes transformers'
own continuation (corrupting every third proposal, so that runs are accepted in part),
equals transformers token for token alone, batched, chunked, preempted (recompute and swap),
from the prefix cache and with tiny blocks. Stop tokens and stop strings inside an accepted
run end the output where they would without speculation; logprobs of accepted tokens are
the plain ones; seeded sampling replays; and sampling keeps its distribution (chi-square).
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch
from scipy import stats

from pagedllm import LLM, SamplingParams
from pagedllm.worker.step_hooks.spec_decode import SpecDecodeHook
from tests.conftest import hf_greedy_tokens

MAX_TOKENS = 24
NGRAM = {
    "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}


def _prompts(vocab_size: int) -> list[list[int]]:
    """Prompts that repeat themselves (so n-gram lookups find matches), of mixed lengths."""
    rng = random.Random(7)
    prompts = []
    for length in (4, 37, 12, 61, 25, 9):
        motif = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(3, 8))]
        prompts.append((motif * 20)[:length])
    return prompts


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    prompts = _prompts(AutoConfig.from_pretrained(tiny_llama_dir).vocab_size)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    return tiny_llama_dir, prompts, hf_greedy_tokens(model, prompts, MAX_TOKENS)


class OracleProposer:
    """Proposes the reference continuation of each prompt; every third proposal has its
    last token changed, so verification accepts it in part."""

    def __init__(self, prompts: list[list[int]], expected: list[list[int]], k: int = 4):
        self.references = [(list(p), list(e)) for p, e in zip(prompts, expected, strict=True)]
        self.k = k
        self.calls = 0

    def propose(self, inputs):
        from pagedllm.spec_decode.proposers import Proposal

        drafts = []
        for tokens in (inputs.token_ids[row] for row in inputs.propose_rows):
            proposal: list[int] = []
            for prompt, expected in self.references:
                if list(tokens[: len(prompt)]) == prompt:
                    position = len(tokens) - len(prompt)
                    proposal = list(expected[position : position + self.k])
                    break
            self.calls += 1
            if proposal and self.calls % 3 == 0:
                proposal[-1] = 3 + (proposal[-1] + 1) % 50
            drafts.append(proposal)
        return Proposal(drafts, [None] * len(drafts))

    def forget(self, request_ids):
        pass


def _engine(llm: LLM):
    return llm.llm_engine.engine_core.engine_core


def _spec_hook(llm: LLM) -> SpecDecodeHook:
    hook = _engine(llm).executor.worker.model_runner.hook(SpecDecodeHook)
    assert isinstance(hook, SpecDecodeHook)
    return hook


def _with_oracle(llm: LLM, prompts, expected, k: int = 4) -> OracleProposer:
    oracle = OracleProposer(prompts, expected, k)
    _spec_hook(llm).proposer = oracle
    return oracle


def _tokens(llm: LLM, prompts, params=None) -> list[list[int]]:
    params = params or SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _watch_block_tables(llm: LLM) -> None:
    """After every step, check that the worker's block tables are the scheduler's (the
    tail of rejected drafts' blocks, freed after the step, is cut at the next one)."""
    core = _engine(llm)
    step = core.step

    def checked_step():
        outputs = step()
        scheduler, runner = core.scheduler, core.executor.worker.model_runner
        for request in scheduler.running:
            state = runner.requests.get(request.request_id)
            if state is None:
                continue
            want = scheduler.kv_cache_manager.get_block_ids(request.request_id)
            have = tuple(state.block_ids)
            kept = scheduler.trimmed_tables.get(request.request_id)
            if kept is not None:
                have = tuple(table[:kept] for table in have)
            assert have == want, request.request_id
        return outputs

    core.step = checked_step


def _check_all_returned(llm: LLM) -> None:
    scheduler = _engine(llm).scheduler
    scheduler.check_integrity()
    manager = scheduler.kv_cache_manager
    assert manager.get_num_free_blocks() == manager.num_usable_blocks


SETTINGS = {
    "default": dict(max_model_len=256),
    "chunked": dict(max_model_len=256, max_num_batched_tokens=16),
    "recompute": dict(max_model_len=96, block_size=8, num_gpu_blocks_override=13),
    "swap": dict(
        max_model_len=96, block_size=8, num_gpu_blocks_override=13, preemption_mode="swap"
    ),
    "tiny_blocks": dict(
        max_model_len=256, block_size=1, max_num_seqs=3, max_num_batched_tokens=40
    ),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("proposer", ["ngram", "oracle"])
def test_greedy_equals_transformers(reference, setting, proposer):
    model_dir, prompts, expected = reference
    llm = LLM(
        str(model_dir), dtype="float32", speculative_config=NGRAM,
        # The default policy proposes for at most 4 running requests; test them all.
        **SETTINGS[setting],
    )
    _spec_hook(llm).config = _no_batch_limit(NGRAM)
    _watch_block_tables(llm)
    if proposer == "oracle":
        _with_oracle(llm, prompts, expected)
    assert _tokens(llm, prompts) == expected
    if setting == "default":
        for prompt, want in zip(prompts, expected, strict=True):
            assert _tokens(llm, [prompt]) == [want]
    counters = _engine(llm).scheduler.spec_counters
    assert counters.num_accepted_tokens > 0
    assert counters.num_accepted_tokens < counters.num_draft_tokens  # some were rejected
    metrics = {m.name: m for m in llm.get_metrics()}  # the offline stats say the same
    assert metrics["pagedllm:spec_decode_num_drafts"].value == counters.num_drafts
    assert metrics["pagedllm:spec_decode_num_accepted_tokens"].value == (
        counters.num_accepted_tokens
    )
    if setting in ("recompute", "swap"):
        assert _engine(llm).scheduler.num_preemptions > 0
    _check_all_returned(llm)


def _no_batch_limit(config: dict):
    from pagedllm.spec_decode.config import SpeculativeConfig

    return SpeculativeConfig.parse({**config, "disable_by_batch_size": 1000})


def test_prefix_cache_hits_keep_output_exact(reference):
    model_dir, prompts, expected = reference
    llm = LLM(str(model_dir), dtype="float32", max_model_len=256, block_size=4,
              speculative_config=NGRAM)
    _with_oracle(llm, prompts, expected)
    assert _tokens(llm, prompts[:3]) == expected[:3]
    # The same prompts again: their blocks (prompt and accepted output) come from the cache.
    extended = [p + e[:10] for p, e in zip(prompts[:3], expected[:3], strict=True)]
    want = hf_greedy_reference(model_dir, extended)
    _with_oracle(llm, extended, want)
    assert _tokens(llm, extended) == want
    assert _engine(llm).scheduler.kv_cache_manager.prefix_cache_hits > 0
    _check_all_returned(llm)


def hf_greedy_reference(model_dir, prompts):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return hf_greedy_tokens(model, prompts, MAX_TOKENS)


def _outputs(llm: LLM, prompts, params):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [
        (list(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].finish_reason,
         o.outputs[0].stop_reason)
        for o in outputs
    ]


def test_stop_token_and_stop_string_inside_an_accepted_run(reference):
    model_dir, prompts, expected = reference
    plain = LLM(str(model_dir), dtype="float32", max_model_len=256)
    spec = LLM(str(model_dir), dtype="float32", max_model_len=256, speculative_config=NGRAM)
    oracle = _with_oracle(spec, prompts, expected, k=8)
    oracle.calls = 1  # corrupt from the third proposal on: the first runs are whole
    prompt, want = prompts[1], expected[1]
    stop_token = want[5]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_token])
    got = _outputs(spec, [prompt], params)
    assert got == _outputs(plain, [prompt], params)
    assert got[0][0][-1] == stop_token and len(got[0][0]) <= 6
    text = plain.get_tokenizer().decode(want)
    stop = text[len(text) // 3 : len(text) // 3 + 3]
    for include in (False, True):
        params = SamplingParams(
            temperature=0.0, max_tokens=MAX_TOKENS, stop=[stop], include_stop_str_in_output=include
        )
        oracle.calls = 1
        assert _outputs(spec, [prompt], params) == _outputs(plain, [prompt], params)
    params = SamplingParams(temperature=0.0, max_tokens=7)
    assert _outputs(spec, [prompt], params) == _outputs(plain, [prompt], params)
    _check_all_returned(spec)


def test_logprobs_of_accepted_tokens_are_the_plain_ones(reference):
    model_dir, prompts, expected = reference
    plain = LLM(str(model_dir), dtype="float32", max_model_len=256)
    spec = LLM(str(model_dir), dtype="float32", max_model_len=256, speculative_config=NGRAM)
    _with_oracle(spec, prompts, expected)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2)
    inputs = [{"prompt_token_ids": p} for p in prompts[:3]]
    want = plain.generate(inputs, params, use_tqdm=False)
    got = spec.generate(inputs, params, use_tqdm=False)
    assert _engine(spec).scheduler.spec_counters.num_accepted_tokens > 0
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].cumulative_logprob == pytest.approx(w.outputs[0].cumulative_logprob)
        for g_pos, w_pos in zip(g.outputs[0].logprobs, w.outputs[0].logprobs, strict=True):
            assert g_pos.keys() == w_pos.keys()
            for token_id, logprob in w_pos.items():
                assert g_pos[token_id].logprob == pytest.approx(logprob.logprob, abs=1e-5)
                assert g_pos[token_id].rank == logprob.rank


def test_seeded_sampling_gives_the_plain_tokens_alone_or_batched_with_n(reference):
    """A seeded row samples each position as plain decoding would and accepts matching
    drafts: the same tokens as without speculation, whatever the batch."""
    model_dir, prompts, expected = reference
    plain = LLM(str(model_dir), dtype="float32", max_model_len=256)
    spec = LLM(str(model_dir), dtype="float32", max_model_len=256, speculative_config=NGRAM)
    _spec_hook(spec).config = _no_batch_limit(NGRAM)
    params = SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS, seed=11, n=3)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    want = plain.generate(inputs, params, use_tqdm=False)
    for batch in (inputs, inputs[2:3]):
        got = spec.generate(batch, params, use_tqdm=False)
        offset = 2 if len(batch) == 1 else 0
        for g, w in zip(got, want[offset:], strict=False):
            assert [o.token_ids for o in g.outputs] == [o.token_ids for o in w.outputs]
    assert len({tuple(o.token_ids) for o in want[2].outputs}) > 1  # n samples differ
    counters = _engine(spec).scheduler.spec_counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    _check_all_returned(spec)


def test_sampling_keeps_its_distribution(reference):
    """Chi-square: the token that follows a verified draft is distributed as without drafts.

    8,000 requests of three tokens, with and without a proposer that always proposes the
    same draft for the second token (a draft drawn from nothing the target knows); the
    second tokens are compared (unseeded rows with one-hot drafts: sample and match)."""
    model_dir, prompts, expected = reference
    prompt = prompts[0]
    num_samples = 8_000
    torch.manual_seed(20_000)  # the engine runs in this process: a reproducible draw
    params = SamplingParams(temperature=1.0, max_tokens=3, detokenize=False, ignore_eos=True)
    counts = []
    for speculate in (False, True):
        llm = LLM(str(model_dir), dtype="float32", max_model_len=64, max_num_seqs=512,
                  max_num_batched_tokens=4096,
                  speculative_config=NGRAM if speculate else None)
        if speculate:
            hook = _spec_hook(llm)
            hook.config = _no_batch_limit(NGRAM)
            hook.proposer = _FixedDraft(expected[0][1])
        outputs = llm.generate([{"prompt_token_ids": prompt}] * num_samples, params,
                               use_tqdm=False)
        counts.append(Counter(o.outputs[0].token_ids[1] for o in outputs))
        if speculate:
            assert _engine(llm).scheduler.spec_counters.num_drafts == num_samples
    tokens = sorted(set(counts[0]) | set(counts[1]), key=lambda t: -counts[0][t] - counts[1][t])
    # Pool rare tokens so that every cell expects at least 5 samples.
    head = [t for t in tokens if counts[0][t] + counts[1][t] >= 20]
    table = [[c[t] for t in head] + [sum(c.values()) - sum(c[t] for t in head)] for c in counts]
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    assert len(table[0]) > 2
    assert stats.chi2_contingency(table).pvalue > 0.01


class _FixedDraft:
    """Proposes one fixed token for every request's second output position."""

    def __init__(self, token: int):
        self.token = token

    def propose(self, inputs):
        from pagedllm.spec_decode.proposers import Proposal

        drafts = [[self.token] for _ in inputs.propose_rows]
        return Proposal(drafts, [None] * len(drafts))

    def forget(self, request_ids):
        pass


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_structured_outputs_check_drafts_against_the_grammar(reference, backend):
    """Drafts the grammar refuses are cut before verification; verified positions sample
    under their own bitmask rows: the same constrained output as without speculation."""
    from pagedllm import StructuredOutputsParams

    model_dir, prompts, _ = reference
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99999},
                       "name": {"type": "string", "pattern": "^[a-z]{1,12}$"}},
        "required": ["id", "name"], "additionalProperties": False,
    }
    constraint = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    plain = LLM(str(model_dir), dtype="float32", max_model_len=256,
                structured_outputs_config={"backend": backend})
    spec = LLM(str(model_dir), dtype="float32", max_model_len=256, speculative_config=NGRAM,
               structured_outputs_config={"backend": backend})
    _spec_hook(spec).config = _no_batch_limit(NGRAM)
    for temperature, seed in ((0.0, None), (1.0, 5)):
        params = SamplingParams(temperature=temperature, seed=seed, max_tokens=60,
                                structured_outputs=constraint)
        inputs = [{"prompt_token_ids": p} for p in prompts[:4]]
        want = [list(o.outputs[0].token_ids)
                for o in plain.generate(inputs, params, use_tqdm=False)]
        # The oracle proposes the constrained reference, with corrupted tokens that the
        # grammar (or the target) refuses.
        _with_oracle(spec, prompts[:4], want)
        got = spec.generate(inputs, params, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in got] == want
        tokenizer = spec.get_tokenizer()
        for output in got:
            if output.outputs[0].finish_reason == "stop":
                text = tokenizer.decode(output.outputs[0].token_ids, skip_special_tokens=True)
                assert json.loads(text).keys() == {"id", "name"}
    counters = _engine(spec).scheduler.spec_counters
    # Corrupted drafts are cut by the grammar or rejected by the target (which one depends
    # on when each grammar finished compiling): the outputs above are the check.
    assert 0 < counters.num_accepted_tokens <= counters.num_draft_tokens
    _check_all_returned(spec)
