"""EAGLE and EAGLE-3 heads (tiny random ones, in the published checkpoint layouts): greedy
output unchanged alone, batched, chunked and preempted; the head reads the target's hidden
states (EAGLE-3: three residual streams) and keeps its own paged KV cache."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from pagedllm import LLM, SamplingParams
from tests.entrypoints.test_spec_decode import (
    SETTINGS,
    _check_all_returned,
    _engine,
    _watch_block_tables,
)
from tests.spec_decode.conftest import PROMPTS

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 4, 2, 16


def _layer_tensors(prefix: str, generator, q_in: int, input_norm: bool) -> dict:
    def rand(*shape):
        return torch.randn(*shape, generator=generator) * 0.1

    tensors = {
        f"{prefix}.self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, q_in),
        f"{prefix}.self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, q_in),
        f"{prefix}.self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, q_in),
        f"{prefix}.self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
        f"{prefix}.post_attention_layernorm.weight": 1 + rand(HIDDEN),
    }
    if input_norm:
        tensors[f"{prefix}.input_layernorm.weight"] = 1 + rand(HIDDEN)
    return tensors


def _llama_config(vocab: int, architecture: str, **extra) -> dict:
    return {
        "architectures": [architecture], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1, "vocab_size": vocab,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", **extra,
    }


def make_eagle(folder, vocab: int, use_pickle: bool = False):
    """An EAGLE (1) head as published: fc (with bias) and layers.0 without its input norm,
    no embeddings and no LM head (the target's are used)."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(1)
    tensors = {
        "fc.weight": torch.randn(HIDDEN, 2 * HIDDEN, generator=generator) * 0.1,
        "fc.bias": torch.randn(HIDDEN, generator=generator) * 0.1,
        **_layer_tensors("layers.0", generator, HIDDEN, input_norm=False),
    }
    if use_pickle:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(_llama_config(vocab, "LlamaForCausalLM")))
    return folder


def make_eagle3(folder, vocab: int, draft_vocab: int = 64):
    """An EAGLE-3 head as published: fc over three streams, midlayer.* with hidden_norm and
    a 2 x hidden attention input, norm, a draft-vocabulary LM head and d2t / t2d."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(2)
    target_ids = torch.randperm(vocab, generator=generator)[:draft_vocab].sort().values
    tensors = {
        "fc.weight": torch.randn(HIDDEN, 3 * HIDDEN, generator=generator) * 0.1,
        **_layer_tensors("midlayer", generator, 2 * HIDDEN, input_norm=True),
        "midlayer.hidden_norm.weight": torch.ones(HIDDEN),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": torch.randn(draft_vocab, HIDDEN, generator=generator) * 0.2,
        "d2t": target_ids - torch.arange(draft_vocab),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, target_ids, True),
    }
    save_file(tensors, str(folder / "model.safetensors"))
    config = _llama_config(vocab, "LlamaForCausalLMEagle3", draft_vocab_size=draft_vocab,
                           eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _vocab(model_dir) -> int:
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="module", params=["eagle", "eagle3"])
def head(request, tiny_llama_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    vocab = _vocab(tiny_llama_dir)
    path = make_eagle(folder, vocab) if request.param == "eagle" else make_eagle3(folder, vocab)
    return request.param, path


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_greedy_output_is_unchanged(tiny_llama_dir, plain_outputs, head, setting):
    method, path = head
    llm = LLM(str(tiny_llama_dir), dtype="float32",
              speculative_config={"method": method, "model": str(path),
                                  "num_speculative_tokens": 3, "disable_by_batch_size": 1000},
              **SETTINGS[setting])
    _watch_block_tables(llm)
    params = SamplingParams(temperature=0.0, max_tokens=30)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == plain_outputs
    assert _engine(llm).scheduler.spec_counters.num_draft_tokens > 0
    _check_all_returned(llm)


def test_eagle3_reads_three_residual_streams(tiny_llama_dir, tmp_path):
    path = make_eagle3(tmp_path / "eagle3", _vocab(tiny_llama_dir))
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128,
              speculative_config={"method": "eagle3", "model": str(path),
                                  "num_speculative_tokens": 2})
    target = _engine(llm).executor.worker.model
    assert target.model.aux_hidden_state_layers == (0, 1, 2)
    seen = {}
    forward = target.forward

    def recording_forward(input_ids, positions):
        seen["hidden"] = forward(input_ids, positions)
        seen["input_ids"] = input_ids
        return seen["hidden"]

    target.forward = recording_forward
    llm.generate([{"prompt_token_ids": PROMPTS[1]}], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    streams = target.model.aux_hidden_states  # of the last step
    assert streams.shape == (len(seen["input_ids"]), 3 * HIDDEN)
    # Before layer 0: the embeddings; after the last layer: what the final norm turns into
    # the target's hidden states.
    embeds = target.model.embed_tokens(seen["input_ids"])
    assert torch.equal(streams[:, :HIDDEN], embeds)
    final, _ = target.model.norm(streams[:, 2 * HIDDEN:].clone())
    assert torch.allclose(final, seen["hidden"], atol=1e-5)


def test_pickled_eagle_loads_like_safetensors(tiny_llama_dir, tmp_path, plain_outputs):
    path = make_eagle(tmp_path / "bin", _vocab(tiny_llama_dir), use_pickle=True)
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256,
              speculative_config={"method": "eagle", "model": str(path),
                                  "num_speculative_tokens": 2})
    params = SamplingParams(temperature=0.0, max_tokens=30)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == plain_outputs


def test_bad_heads_raise(tiny_llama_dir, tmp_path):
    path = make_eagle3(tmp_path / "far", _vocab(tiny_llama_dir))
    config = json.loads((path / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [0, 1, 9]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="aux hidden state layers"):
        LLM(str(tiny_llama_dir), speculative_config={"method": "eagle3", "model": str(path)})


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_bfloat16_heads(tiny_llama_dir, tmp_path, method):
    """In bfloat16 the heads' float32 residual stream meets the fused CPU norms (a bfloat16
    one once overran their buffer): the output is the plain bfloat16 engine's."""
    vocab = _vocab(tiny_llama_dir)
    path = (make_eagle if method == "eagle" else make_eagle3)(tmp_path / method, vocab)
    params = SamplingParams(temperature=0.0, max_tokens=20)
    inputs = [{"prompt_token_ids": p} for p in PROMPTS[:1]]
    plain = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=128)
    want = [o.outputs[0].token_ids for o in plain.generate(inputs, params, use_tqdm=False)]
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", max_model_len=128,
              speculative_config={"method": method, "model": str(path),
                                  "num_speculative_tokens": 3})
    got = [o.outputs[0].token_ids for o in llm.generate(inputs, params, use_tqdm=False)]
    assert got == want
    assert _engine(llm).scheduler.spec_counters.num_draft_tokens > 0
