"""cache_salt (vLLM's prompt field): requests share prefix-cache blocks only with the same
salt; a salted prompt never reads an unsalted one's blocks, nor another salt's."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

TOKENS = list(range(5, 45))  # 40 tokens: two full 16-token blocks


def _cached(llm: LLM, salt: str | None) -> int:
    prompt = {"prompt_token_ids": TOKENS, **({"cache_salt": salt} if salt else {})}
    (output,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2),
                             use_tqdm=False)
    return output.num_cached_tokens


def test_only_the_same_salt_shares_blocks(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_gpu_blocks_override=128)
    assert _cached(llm, "tenant-a") == 0
    assert _cached(llm, "tenant-a") == 32  # the same salt: both full blocks
    assert _cached(llm, "tenant-b") == 0  # another salt
    assert _cached(llm, None) == 0  # no salt
    assert _cached(llm, None) == 32  # unsalted prompts share among themselves
    assert _cached(llm, "tenant-b") == 32


def test_a_bad_salt_is_refused(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_gpu_blocks_override=128)
    for salt in ("", 5):
        with pytest.raises(ValueError, match="cache_salt"):
            llm.generate([{"prompt_token_ids": TOKENS, "cache_salt": salt}],
                         SamplingParams(max_tokens=1), use_tqdm=False)
