"""Fixtures shared by the decode-step fast paths' tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_arch_checkpoint(tiny_tokenizer_dir, tmp_path_factory):
    """A tiny random checkpoint of an architecture (tests/models' configs), with the tiny
    tokenizer, made on first use."""
    from transformers import AutoTokenizer, Qwen2Config

    from tests.models.test_model_parity import _COMMON, arch_config, save_random

    made: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in made:
            vocab_size = len(AutoTokenizer.from_pretrained(tiny_tokenizer_dir))
            if arch == "qwen2":  # save_random makes its q/k/v biases non-zero
                config = Qwen2Config(**{**_COMMON, "vocab_size": vocab_size})
            elif arch == "qwen2_moe":  # a shared expert of whole 32-value groups
                config = arch_config(arch, vocab_size=vocab_size,
                                     shared_expert_intermediate_size=64)
            elif arch == "gemma3":  # sqrt(96) is not a power of two: the embedding
                # scale's bfloat16 product rounds (the call must round it as torch does)
                config = arch_config(arch, vocab_size=vocab_size, hidden_size=96)
            else:
                config = arch_config(arch, vocab_size=vocab_size)
            path = save_random(tmp_path_factory.mktemp(f"stack_{arch}"), config)
            for name in Path(tiny_tokenizer_dir).iterdir():
                shutil.copy(name, path / name.name)
            made[arch] = path
        return made[arch]

    return make
