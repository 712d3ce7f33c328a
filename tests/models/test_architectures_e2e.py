"""Every architecture through the whole engine: greedy float32 tokens equal transformers'
`generate`, with requests batched, prefills chunked, a shared prefix cached and requests
preempted (recompute) for want of KV blocks."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pagedllm import LLM, SamplingParams

from ..conftest import hf_greedy_tokens
from .test_model_parity import NEW_ARCHITECTURES, arch_config, save_random

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Five prompts sharing a 40-token prefix (one repeated), and two unrelated ones."""
    rng = random.Random(3)
    prefix = [rng.randrange(3, 380) for _ in range(40)]
    shared = [prefix + [rng.randrange(3, 380) for _ in range(n)] for n in (3, 7, 1, 11)]
    others = [[rng.randrange(3, 380) for _ in range(n)] for n in (25, 6)]
    return [*shared, shared[0], *others]


@pytest.mark.parametrize("arch", NEW_ARCHITECTURES)
def test_engine_matches_transformers(arch, prompts, tiny_tokenizer_dir, tmp_path: Path):
    check_engine_matches_transformers(arch, prompts, tiny_tokenizer_dir, tmp_path)


def check_engine_matches_transformers(
    arch: str, prompts: list[list[int]], tiny_tokenizer_dir: Path, tmp_path: Path
) -> LLM:
    """A random tiny `arch` model through the engine (batched, chunked, prefix-cached,
    preempted) gives transformers' greedy tokens and frees every block; returns the LLM."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    ids = dict(
        vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    path = save_random(tmp_path, arch_config(arch, **ids))
    for name in Path(tiny_tokenizer_dir).iterdir():
        shutil.copy(name, tmp_path / name.name)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = hf_greedy_tokens(theirs, prompts, MAX_TOKENS)

    # 13 usable blocks of 8 tokens cannot hold the 7 requests at once; 16-token chunks.
    # Gemma 3's layers make three KV cache groups (two sliding, one global) of one layer
    # each: a block is a third of the size, and one request needs blocks in every group.
    # Mistral's 5-token window lets a request keep at most 4 blocks: 5 usable ones.
    num_blocks = {"gemma3": 24, "mistral_window": 6}.get(arch, 14)
    llm = LLM(
        str(path), dtype="float32", max_model_len=96, block_size=8,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=16, enable_prefix_caching=True, preemption_mode="recompute",
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.num_preemptions > 0
    assert scheduler.make_stats().prefix_cache_hits > 0
    manager = scheduler.kv_cache_manager
    assert manager.get_num_free_blocks() == manager.num_usable_blocks
    return llm


@pytest.mark.parametrize("arch", ["gemma3", "mistral_window"])
def test_sliding_window_layers_free_blocks_and_swap(
    arch, prompts, tiny_tokenizer_dir, tmp_path: Path
):
    """Sliding layers let blocks go behind the window, swap preemption copies the blocks of
    every group (slots shared between groups), and the tokens stay transformers'."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    path = save_random(tmp_path, arch_config(arch, vocab_size=len(tokenizer)))
    for name in Path(tiny_tokenizer_dir).iterdir():
        shutil.copy(name, tmp_path / name.name)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = hf_greedy_tokens(theirs, prompts, MAX_TOKENS)
    num_blocks = {"gemma3": 40, "mistral_window": 9}[arch]  # too few for all 7 at once
    llm = LLM(
        str(path), dtype="float32", max_model_len=96, block_size=4,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=16, enable_prefix_caching=False, preemption_mode="swap",
        swap_space=0.01,
    )  # fmt: skip
    core = llm.llm_engine.engine_core.engine_core
    scheduler, worker = core.scheduler, core.executor.worker
    manager = scheduler.kv_cache_manager
    swapped_out = []
    swap_blocks = worker.swap_blocks

    def recording_swap_blocks(scheduler_output):
        swapped_out.extend(scheduler_output.blocks_to_swap_out)
        swap_blocks(scheduler_output)

    worker.swap_blocks = recording_swap_blocks
    assert any(group.sliding_window for group in manager.groups)
    # One long request alone: its sliding tables hold only the window's blocks.
    (alone,) = llm.generate(
        [{"prompt_token_ids": prompts[3]}], SamplingParams(temperature=0.0, max_tokens=1),
        use_tqdm=False,
    )  # fmt: skip
    assert list(alone.outputs[0].token_ids) == expected[3][:1]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    assert swapped_out, "no request was swapped out"
    assert manager.get_num_free_blocks() == manager.num_usable_blocks
