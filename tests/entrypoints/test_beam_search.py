"""LLM.beam_search equals transformers' `generate(num_beams=W, do_sample=False)`.

The checkpoint is the tiny Llama with its EOS row of the LM head scaled up, so that EOS is
often among the candidates and finished hypotheses, length penalty and the early-stopping
rules all matter. Every returned sequence and its score must match, for several settings.
"""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from pagedllm import LLM, BeamSearchParams

SETTINGS = [
    # (beam_width, max_tokens, length_penalty, early_stopping)
    (2, 10, 1.0, False),
    (3, 12, 0.5, False),
    (3, 8, 2.0, True),
    (3, 10, 1.0, "never"),
    (2, 8, -1.0, False),
]


@pytest.fixture(scope="module")
def eos_heavy_dir(tiny_llama_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    model.lm_head.weight.data[model.config.eos_token_id] *= 2.0
    out = tmp_path_factory.mktemp("tiny_llama_eos")
    model.save_pretrained(out)
    for path in tiny_llama_dir.iterdir():
        if path.name.startswith("tokenizer") or path.suffix == ".jinja":
            shutil.copy(path, out / path.name)
    return out


@pytest.fixture(scope="module")
def setup(eos_heavy_dir):
    from transformers import AutoModelForCausalLM

    llm = LLM(str(eos_heavy_dir), dtype="float32", max_model_len=128, num_gpu_blocks_override=64)
    reference = AutoModelForCausalLM.from_pretrained(eos_heavy_dir, dtype=torch.float32).eval()
    return llm, reference


def _prompts(vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(rng.randrange(2, 20))] for _ in range(3)]


def _hf_beams(model, prompt: list[int], width: int, max_tokens: int, penalty: float, early):
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        max_new_tokens=max_tokens,
        length_penalty=penalty,
        early_stopping=early,
        return_dict_in_generate=True,
        output_scores=True,
        pad_token_id=model.config.pad_token_id,
    )
    # beam_indices is -1 past each sequence's end: it gives the generated length.
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()
    tokens = [
        out.sequences[i, len(prompt) : len(prompt) + n].tolist() for i, n in enumerate(lengths)
    ]
    return tokens, out.sequences_scores.tolist()


@pytest.mark.parametrize("width, max_tokens, penalty, early", SETTINGS)
def test_equals_transformers(setup, width, max_tokens, penalty, early):
    llm, reference = setup
    prompts = _prompts(reference.config.vocab_size, seed=width * 100 + max_tokens)
    params = BeamSearchParams(
        beam_width=width, max_tokens=max_tokens, length_penalty=penalty, early_stopping=early
    )
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output in zip(prompts, outputs, strict=True):
        want_tokens, want_scores = _hf_beams(reference, prompt, width, max_tokens, penalty, early)
        assert [s.tokens[len(prompt) :] for s in output.sequences] == want_tokens
        assert all(s.tokens[: len(prompt)] == prompt for s in output.sequences)
        scores = [s.score for s in output.sequences]
        assert scores == pytest.approx(want_scores, abs=1e-4 * max_tokens)


def test_sequence_fields_and_block_sharing(setup):
    llm, reference = setup
    eos = reference.config.eos_token_id
    tokenizer = llm.get_tokenizer()
    core = llm.llm_engine.engine_core.engine_core
    manager = core.scheduler.kv_cache_manager
    hits_before = manager.prefix_cache_hits
    prompt = "The quick brown fox jumps over the lazy dog."
    (output,) = llm.beam_search(prompt, BeamSearchParams(beam_width=3, max_tokens=12))
    num_prompt = len(tokenizer.encode(prompt))
    for seq in output.sequences:
        generated = seq.tokens[num_prompt:]
        assert len(seq.logprobs) == len(generated)
        assert seq.cum_logprob == pytest.approx(
            sum(lp[t].logprob for t, lp in zip(generated, seq.logprobs, strict=False)), abs=1e-5
        )
        if seq.finish_reason == "stop":
            assert generated[-1] == eos
            generated = generated[:-1]
        assert seq.text == tokenizer.decode(generated, skip_special_tokens=True)
    # Each step resubmits every beam; their shared full blocks come from the prefix cache.
    assert manager.prefix_cache_hits > hits_before
    manager.check_integrity()
    assert not core.scheduler.has_unfinished_requests()


def test_ignore_eos_runs_every_beam_to_max_tokens(setup):
    llm, _ = setup
    params = BeamSearchParams(beam_width=2, max_tokens=9, ignore_eos=True)
    (output,) = llm.beam_search([{"prompt_token_ids": [5, 6, 7]}], params)
    assert [len(s.tokens) - 3 for s in output.sequences] == [9, 9]
    assert {s.finish_reason for s in output.sequences} == {"length"}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"beam_width": 0, "max_tokens": 4}, "beam_width"),
        ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
        ({"beam_width": 2, "max_tokens": 4, "early_stopping": "sometimes"}, "early_stopping"),
        ({"beam_width": 2, "max_tokens": 4, "length_penalty": float("nan")}, "length_penalty"),
    ],
)
def test_invalid_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)
