"""End to end on a tiny model: prefix caching, swap / recompute preemption, priorities.

Outputs must not depend on how the KV got into the cache: greedy (and seeded) outputs are
identical with prefix caching on and off, with swap, recompute or no preemption, and for
requests sharing a long system prompt. The second run of a shared prefix computes only the
new tokens, counted by the scheduler as prompt tokens the model actually ran.
"""

from __future__ import annotations

import random

import pytest

from pagedllm import LLM, SamplingParams

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


def _core(llm: LLM):
    return llm.llm_engine.engine_core.engine_core


def _scheduler(llm: LLM):
    return _core(llm).scheduler


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [[c.token_ids for c in o.outputs] for o in outputs]


def _all_blocks_free(llm: LLM) -> bool:
    scheduler = _scheduler(llm)
    scheduler.check_integrity()
    manager, swap = scheduler.kv_cache_manager, scheduler.swap_manager
    host_free = swap.block_pool is None or (
        swap.get_num_free_blocks() == swap.block_pool.num_usable_blocks
    )
    return manager.get_num_free_blocks() == manager.num_usable_blocks and host_free


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """A long shared system prompt + short questions, some repeated, and unrelated prompts."""
    rng = random.Random(7)
    system = [rng.randrange(3, 300) for _ in range(70)]
    questions = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 9, 1, 12, 5)]
    shared = [system + q for q in questions] + [system + questions[0]]  # one exact duplicate
    others = [[rng.randrange(3, 300) for _ in range(n)] for n in (30, 8)]
    return shared + others


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, prompts) -> list[list[list[int]]]:
    """Greedy tokens of each prompt run alone, with prefix caching off: nothing shared."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256, enable_prefix_caching=False)
    return [_tokens(llm, [p])[0] for p in prompts]


def test_prefix_caching_on_matches_off(tiny_llama_dir, prompts, reference):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256, block_size=8)
    assert _tokens(llm, prompts) == reference
    stats = _scheduler(llm).make_stats()
    # Requests admitted in the same step share the system prompt's blocks at once.
    assert stats.prefix_cache_hits >= 5 * 64
    assert stats.prefix_cache_queries == sum(len(p) for p in prompts)
    assert stats.num_computed_prompt_tokens == stats.prefix_cache_queries - stats.prefix_cache_hits
    assert _all_blocks_free(llm)
    # Run again: every prompt now hits the cache (capped so the last token is computed).
    assert _tokens(llm, prompts) == reference
    assert _all_blocks_free(llm)


def test_second_run_of_shared_prefix_computes_only_new_tokens(tiny_llama_dir, prompts, reference):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256, block_size=8)
    scheduler = _scheduler(llm)
    first, second = prompts[0], prompts[1]  # same 70-token system prompt, then 5 / 9 tokens
    assert _tokens(llm, [first]) == [reference[0]]
    assert scheduler.num_computed_prompt_tokens == len(first)
    before = scheduler.num_computed_prompt_tokens
    assert _tokens(llm, [second]) == [reference[1]]
    # 8 full blocks (64 tokens) of the system prompt hit; only the rest ran.
    assert scheduler.num_computed_prompt_tokens - before == len(second) - 64
    assert second[:64] == first[:64] and second[:72] != first[:72]


def test_parallel_samples_share_the_prompt(tiny_llama_dir, prompts):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256, block_size=8)
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=MAX_TOKENS)
    (samples,) = _tokens(llm, [prompts[3]], params)
    assert len(samples) == 4
    stats = _scheduler(llm).make_stats()
    # The prompt (82 tokens, 10 full blocks) is computed once; 3 siblings hit 80 tokens.
    assert stats.prefix_cache_hits == 3 * 80
    assert stats.num_computed_prompt_tokens == 82 + 3 * 2
    off = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        max_model_len=256,
        block_size=8,
        enable_prefix_caching=False,
    )
    assert _tokens(off, [prompts[3]], params) == [samples]


@pytest.mark.parametrize("preemption_mode", ["swap", "recompute"])
@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_preemption_output_matches_no_preemption(
    tiny_llama_dir, prompts, reference, preemption_mode, enable_prefix_caching
):
    # 15 usable blocks of 8 tokens (= max_model_len) cannot hold these 8 requests at once.
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        max_model_len=120,
        block_size=8,
        num_gpu_blocks_override=16,
        preemption_mode=preemption_mode,
        swap_space=0.01,
        enable_prefix_caching=enable_prefix_caching,
    )
    swapped_blocks = []
    worker = llm.llm_engine.engine_core.engine_core.executor.worker
    original_swap = worker.swap_blocks

    def spy(scheduler_output):
        swapped_blocks.extend(scheduler_output.blocks_to_swap_in)
        original_swap(scheduler_output)

    worker.swap_blocks = spy
    assert _tokens(llm, prompts) == reference
    scheduler = _scheduler(llm)
    assert scheduler.num_preemptions > 0
    assert bool(swapped_blocks) == (preemption_mode == "swap")
    assert _all_blocks_free(llm)


def test_seeded_sampling_survives_swap_preemption(tiny_llama_dir, prompts):
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=MAX_TOKENS)
    roomy = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=120, block_size=8)
    tight = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        max_model_len=120,
        block_size=8,
        num_gpu_blocks_override=16,
        preemption_mode="swap",
        swap_space=0.01,
    )
    assert _tokens(tight, prompts, params) == _tokens(roomy, prompts, params)
    assert _scheduler(tight).num_preemptions > 0


def test_priority_policy_end_to_end(tiny_llama_dir, prompts, reference):
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        max_model_len=120,
        block_size=8,
        num_gpu_blocks_override=16,
        scheduling_policy="priority",
        max_num_seqs=2,
    )
    priorities = list(range(len(prompts)))[::-1]  # the last prompt first
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False, priority=priorities
    )
    assert [[c.token_ids for c in o.outputs] for o in outputs] == reference
    assert _all_blocks_free(llm)
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["a", "b"], GREEDY, use_tqdm=False, priority=[0])


def test_stats_in_core_outputs_and_reset(tiny_llama_dir, prompts):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256, block_size=8)
    core = _core(llm)
    engine = llm.llm_engine
    engine.add_request("a", {"prompt_token_ids": prompts[0]}, GREEDY)
    engine.add_request("b", {"prompt_token_ids": prompts[1]}, GREEDY)
    outputs = core.step()
    stats = outputs.scheduler_stats
    assert stats is not None and stats.num_running_reqs == 2 and stats.kv_cache_usage > 0
    assert stats.prefix_cache_hits == 64 and stats.prefix_cache_hit_rate > 0
    assert core.reset_prefix_cache() is False  # blocks in use
    engine.abort_request(["a", "b"])
    assert core.reset_prefix_cache() is True
    assert _scheduler(llm).kv_cache_manager.block_pool.get_num_cached_blocks() == 0


def test_bad_scheduling_arguments(tiny_llama_dir):
    with pytest.raises(ValueError, match="preemption_mode"):
        LLM(str(tiny_llama_dir), dtype="float32", preemption_mode="drop")
    with pytest.raises(ValueError, match="scheduling_policy"):
        LLM(str(tiny_llama_dir), dtype="float32", scheduling_policy="lifo")
    with pytest.raises(ValueError, match="swap_space"):
        LLM(str(tiny_llama_dir), dtype="float32", swap_space=-1)
