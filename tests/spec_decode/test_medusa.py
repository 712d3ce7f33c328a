"""Medusa heads (tiny random ones, in both published layouts): drafts from the target's last
hidden state, greedy output unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from pagedllm import LLM, SamplingParams
from pagedllm.spec_decode.medusa import load_medusa_heads

HIDDEN = 64  # the tiny Llama's


def _vocab(model_dir) -> int:
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


def make_medusa(folder, vocab: int, num_heads: int = 3, num_layers: int = 1,
                layout: str = "original"):
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            weight = torch.randn(HIDDEN, HIDDEN, generator=generator) * 0.1
            bias = torch.randn(HIDDEN, generator=generator) * 0.1
            if layout == "original":
                tensors[f"{head}.{layer}.linear.weight"] = weight
                tensors[f"{head}.{layer}.linear.bias"] = bias
            else:
                tensors[f"blocks.{head}.layers.{layer}.weight"] = weight
                tensors[f"blocks.{head}.layers.{layer}.bias"] = bias
        projection = torch.randn(vocab, HIDDEN, generator=generator) * 0.2
        name = f"{head}.{num_layers}.weight" if layout == "original" else f"lm_heads.{head}.weight"
        tensors[name] = projection
    save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    config = (
        {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers}
        if layout == "original"
        else {"model_type": "medusa", "num_heads": num_heads, "num_hidden_layers": num_layers,
              "hidden_size": HIDDEN, "vocab_size": vocab}
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_both_layouts_load_the_same_heads(tmp_path, tiny_llama_dir):
    vocab = _vocab(tiny_llama_dir)
    original = load_medusa_heads(str(make_medusa(tmp_path / "a", vocab, num_layers=2)),
                                 torch.float32, torch.device("cpu"))
    converted = load_medusa_heads(
        str(make_medusa(tmp_path / "b", vocab, num_layers=2, layout="vllm")),
        torch.float32, torch.device("cpu"),
    )
    x = torch.randn(5, HIDDEN)
    assert torch.equal(original(x), converted(x))
    assert original(x).shape == (3, 5, vocab)


def test_greedy_output_is_unchanged(tmp_path, tiny_llama_dir):
    from tests.entrypoints.test_spec_decode import _check_all_returned, _engine

    heads = make_medusa(tmp_path / "medusa", _vocab(tiny_llama_dir))
    prompts = [[5, 17, 42, 8, 5, 17, 42], [7, 7, 12] * 5, [101, 55, 23]]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    plain = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256)
    want = [o.outputs[0].token_ids for o in plain.generate(inputs, params, use_tqdm=False)]
    spec = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256,
               speculative_config={"method": "medusa", "model": str(heads),
                                   "num_speculative_tokens": 3})
    got = [o.outputs[0].token_ids for o in spec.generate(inputs, params, use_tqdm=False)]
    assert got == want
    assert _engine(spec).scheduler.spec_counters.num_draft_tokens > 0
    _check_all_returned(spec)


def test_bad_checkpoints_raise(tmp_path, tiny_llama_dir):
    heads = make_medusa(tmp_path / "medusa", _vocab(tiny_llama_dir), num_heads=2)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(str(tiny_llama_dir), speculative_config={
            "method": "medusa", "model": str(heads), "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="folder"):
        LLM(str(tiny_llama_dir), speculative_config={
            "method": "medusa", "model": str(tmp_path / "nowhere")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no weights"):
        LLM(str(tiny_llama_dir), speculative_config={
            "method": "medusa", "model": str(tmp_path / "empty")})
