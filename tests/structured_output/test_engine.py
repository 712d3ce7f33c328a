"""Constrained requests through the engine (tiny random Llama): every output is in the
constraint's language, free neighbours are untouched, and the matcher survives preemption.

A random model picks arbitrary tokens, so the constraints here have finite languages (bounded
strings, integers and arrays): the grammar must then end every output, with finish reason
"stop", whatever the model prefers.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from pagedllm import LLM, SamplingParams, StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "day": {"type": "string", "format": "date"},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "pet": {
            "anyOf": [
                {"type": "object", "properties": {"legs": {"type": "integer", "minimum": 0,
                                                           "maximum": 8}},
                 "required": ["legs"], "additionalProperties": False},
                {"type": "null"},
            ]
        },
    },
    "required": ["id", "name", "day", "kind", "tags", "pet"],
    "additionalProperties": False,
}
REGEX = r"[ab]{2}-[0-9]{3}"
CHOICES = ["red", "green", "blue"]
PROMPTS = [[5, 17, 42, 8], [7, 7, 12], [101, 55, 23, 61, 9], [4, 44]]


@pytest.fixture(scope="module", params=["xgrammar", "guidance"])
def llm(tiny_llama_dir, request) -> LLM:
    """The tiny model with each grammar backend."""
    return LLM(str(tiny_llama_dir), max_model_len=512, dtype="float32",
               structured_outputs_config={"backend": request.param})


def _run(llm: LLM, constraint: StructuredOutputsParams, seed: int, **kwargs) -> list:
    params = SamplingParams(
        temperature=1.0, seed=seed, max_tokens=400, structured_outputs=constraint, **kwargs
    )
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    return [c for o in llm.generate(prompts, params, use_tqdm=False) for c in o.outputs]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("compact", [False, True])
def test_json_schema_outputs_validate(llm, seed, compact):
    constraint = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=compact)
    for completion in _run(llm, constraint, seed):
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), SCHEMA)
        if compact:
            assert "\n" not in completion.text


def test_regex_and_choice_outputs_match(llm):
    for completion in _run(llm, StructuredOutputsParams(regex=REGEX), seed=3):
        assert completion.finish_reason == "stop"
        assert re.fullmatch(REGEX, completion.text), completion.text
    for completion in _run(llm, StructuredOutputsParams(choice=CHOICES), seed=4, n=2):
        assert completion.finish_reason == "stop"
        assert completion.text in CHOICES


def test_grammar_outputs_match(llm):
    grammar = 'root ::= "(" item ("," item){0,2} ")"\nitem ::= [0-9] | "x"'
    for completion in _run(llm, StructuredOutputsParams(grammar=grammar), seed=5):
        assert re.fullmatch(r"\((?:[0-9x])(?:,[0-9x]){0,2}\)", completion.text), completion.text


def test_json_object_is_a_json_object(llm):
    params = SamplingParams(
        temperature=0.0, max_tokens=64, structured_outputs=StructuredOutputsParams(json_object=True)
    )
    for output in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False):
        text = output.outputs[0].text
        assert text.lstrip().startswith("{"), text
        if output.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_free_neighbours_are_untouched(llm):
    """Unconstrained requests sample the same tokens beside constrained ones as alone."""
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    seeded = SamplingParams(temperature=0.9, seed=11, max_tokens=12, ignore_eos=True)
    constrained = SamplingParams(
        temperature=1.0, seed=3, max_tokens=40,
        structured_outputs=StructuredOutputsParams(regex=REGEX),
    )
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
    alone = llm.generate(prompts, [free, seeded], use_tqdm=False)
    mixed = llm.generate(
        [*prompts, *prompts], [free, seeded, constrained, constrained], use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in mixed[:2]] == [o.outputs[0].token_ids for o in alone]
    assert all(re.fullmatch(REGEX, o.outputs[0].text) for o in mixed[2:])


def test_bad_constraint_raises_before_queueing(llm):
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="a(b"))
    with pytest.raises(ValueError, match=r"structured_outputs\.regex"):
        llm.generate([{"prompt_token_ids": [1, 2]}], params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_matcher_survives_preemption(tiny_llama_dir):
    """With a cache too small for the batch, requests are preempted and recomputed; greedy
    constrained outputs equal those of a roomy cache and stay valid."""
    constraint = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = SamplingParams(temperature=0.0, max_tokens=200, structured_outputs=constraint)
    prompts = [{"prompt_token_ids": p * 6} for p in PROMPTS]
    roomy = LLM(str(tiny_llama_dir), max_model_len=256, dtype="float32")
    tight = LLM(
        str(tiny_llama_dir), max_model_len=256, dtype="float32", num_gpu_blocks_override=20,
        block_size=16, enable_prefix_caching=False,
    )
    want = [o.outputs[0].text for o in roomy.generate(prompts, params, use_tqdm=False)]
    got = tight.generate(prompts, params, use_tqdm=False)
    core = tight.llm_engine.engine_core.engine_core
    assert core.scheduler.num_preemptions > 0
    assert [o.outputs[0].text for o in got] == want
    for text in want:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_logprobs_of_constrained_tokens(llm):
    """Logprobs come back for every constrained token (raw distribution, as vLLM's default)."""
    params = SamplingParams(temperature=0.0, max_tokens=40, logprobs=2,
                            structured_outputs=StructuredOutputsParams(regex=REGEX))
    seq = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params, use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(REGEX, seq.text)
    assert len(seq.logprobs) == len(seq.token_ids)
    for token, entry in zip(seq.token_ids, seq.logprobs, strict=True):
        assert token in entry and entry[token].logprob <= 0.0


def test_prefix_cached_prompt_gives_the_same_constrained_output(tiny_llama_dir):
    cached = LLM(str(tiny_llama_dir), max_model_len=256, dtype="float32", block_size=4,
                 enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=200, structured_outputs=(
        StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)))
    prompt = {"prompt_token_ids": PROMPTS[2] * 4}
    first = cached.generate([prompt], params, use_tqdm=False)[0]
    second = cached.generate([prompt], params, use_tqdm=False)[0]
    stats = cached.llm_engine.engine_core.engine_core.scheduler.make_stats()
    assert stats.prefix_cache_hits > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    jsonschema.validate(json.loads(second.outputs[0].text), SCHEMA)


def test_matcher_rolls_back(llm):
    """Accepting tokens and rolling them back restores the allowed set (for drafts)."""
    import torch

    from pagedllm.structured_output.manager import _load_backend

    tokenizer = llm.get_tokenizer()
    name = llm.llm_engine.engine_config.structured_outputs_config.resolved_backend
    backend = _load_backend(name, tokenizer, len(tokenizer))
    compiled = backend.compile(StructuredOutputsParams(choice=["ab-1", "ba-2"]))
    matcher = backend.matcher(compiled, [tokenizer.eos_token_id])
    words = (len(tokenizer) + 31) // 32
    before, after = torch.zeros(1, words, dtype=torch.int32), torch.zeros(1, words,
                                                                          dtype=torch.int32)
    matcher.fill_bitmask(before, 0)
    tokens = tokenizer.encode("ab-1", add_special_tokens=False)
    assert matcher.accept_tokens(tokens)
    matcher.rollback(len(tokens))
    matcher.fill_bitmask(after, 0)
    assert torch.equal(before, after)
    assert not matcher.accept_tokens(tokenizer.encode("zz", add_special_tokens=False))
