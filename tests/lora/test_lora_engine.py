"""Multi-LoRA end to end: four random PEFT adapters (made with peft) on tiny Llama and Qwen2
checkpoints; greedy float32 output equals transformers + peft token for token, with all four
and base requests mixed in one batch, chunked, and from the prefix cache."""

from __future__ import annotations

import random

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.lora.request import LoRARequest
from tests.lora.adapters import (
    ADAPTERS,
    MAX_TOKENS,
    make_adapter,
    misfit_adapter,
    reference_tokens,
)


@pytest.fixture(scope="module", params=["tiny_llama_dir", "tiny_qwen2_dir"])
def setup(request, tmp_path_factory):
    model_dir = request.getfixturevalue(request.param)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    rng = random.Random(3)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 23, 40, 11, 31)]
    folder = tmp_path_factory.mktemp("adapters")
    loras = []
    expected = {None: reference_tokens(model_dir, None, prompts)}
    for index, (rank, alpha, targets, rslora) in enumerate(ADAPTERS):
        path = make_adapter(model_dir, folder / f"a{index}", rank, alpha, targets, rslora,
                            seed=index)
        lora = LoRARequest(f"adapter{index}", index + 1, str(path))
        loras.append(lora)
        expected[lora.lora_int_id] = reference_tokens(model_dir, path, prompts)
    return model_dir, prompts, loras, expected


def _mixed(prompts, loras):
    """Every (prompt, adapter or none) pair, interleaved."""
    pairs = [(p, lora) for p in prompts for lora in [None, *loras]]
    random.Random(0).shuffle(pairs)
    return pairs


@pytest.mark.parametrize("engine_args", [
    dict(max_model_len=256),
    dict(max_model_len=256, max_num_batched_tokens=16),  # chunked prefill
    dict(max_model_len=256, max_loras=2, block_size=4),  # at most two adapters a step
    dict(max_model_len=256, num_scheduler_steps=4),  # multi-step: adapters every step
])
def test_mixed_batch_equals_transformers_and_peft(setup, engine_args):
    model_dir, prompts, loras, expected = setup
    engine_args = {"max_loras": 4, **engine_args}
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_lora_rank=16,
              max_cpu_loras=4, **engine_args)
    pairs = _mixed(prompts, loras)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p, _ in pairs], params,
                           use_tqdm=False, lora_request=[lora for _, lora in pairs])
    for (prompt, lora), output in zip(pairs, outputs, strict=True):
        key = None if lora is None else lora.lora_int_id
        assert output.outputs[0].token_ids == expected[key][prompts.index(prompt)], key
    # Again: the prompts' blocks come from the prefix cache, per adapter.
    again = llm.generate([{"prompt_token_ids": p} for p, _ in pairs], params,
                         use_tqdm=False, lora_request=[lora for _, lora in pairs])
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outputs]
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.kv_cache_manager.prefix_cache_hits > 0
    scheduler.check_integrity()


def test_same_prompt_under_two_adapters_never_shares_kv(setup):
    model_dir, prompts, loras, expected = setup
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=2,
              max_model_len=256, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    prompt = prompts[2]
    for lora in (None, loras[0], loras[1], None, loras[0]):
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False,
                           lora_request=lora)
        key = None if lora is None else lora.lora_int_id
        assert out[0].outputs[0].token_ids == expected[key][2]


@pytest.mark.parametrize("quantization", ["int4", None], ids=["w4a8", "dense_bf16"])
def test_decode_stack_adds_lora_deltas_as_the_python_layers(
    setup, monkeypatch, quantization, bf16_panels
):
    """bfloat16 W4A8 or dense bf16 panels: LoRA decode steps run in the C decode stack,
    which adds each matrix's deltas with the same kernel the Python layers call: the same
    tokens and bit-identical logprobs as with the stack off, adapters and base requests
    mixed. Panels for every step: on matrix units the engine with the stack would otherwise
    measure how far it serves (stack_reach.py) and multiply its larger steps as the other
    engine's layers do not."""
    bf16_panels("always")
    from pagedllm.worker.decode_step.cpu_stack import CpuDecodeStack

    model_dir, prompts, loras, _ = setup
    kwargs = dict(dtype="bfloat16", quantization=quantization, enable_lora=True, max_loras=4,
                  max_model_len=128)
    llm = LLM(str(model_dir), **kwargs)
    runner = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner
    if runner.decode_step is None:
        pytest.skip("the decode stack is not built for this model on this machine")
    calls = []
    original = CpuDecodeStack.run
    monkeypatch.setattr(CpuDecodeStack, "run",
                        lambda self, batch: calls.append(1) or original(self, batch))
    pairs = _mixed(prompts[:3], loras)
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2)

    def run(engine):
        return engine.generate([{"prompt_token_ids": p} for p, _ in pairs], params,
                               use_tqdm=False, lora_request=[lora for _, lora in pairs])

    with_stack = run(llm)
    assert calls, "LoRA decode steps use the stack"
    monkeypatch.setenv("PAGEDLLM_DECODE_STACK", "python")
    python_layers = LLM(str(model_dir), **kwargs)
    calls.clear()
    reference = run(python_layers)
    assert not calls
    for got, want in zip(with_stack, reference, strict=True):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        got_lp = [{k: v.logprob for k, v in step.items()} for step in got.outputs[0].logprobs]
        want_lp = [{k: v.logprob for k, v in step.items()} for step in want.outputs[0].logprobs]
        assert got_lp == want_lp


def test_add_remove_and_list_loras(setup, tmp_path):
    """add_lora loads (and checks) an adapter up front; remove_lora drops it; a misfit
    adapter or a reused id is refused with a ValueError and the engine goes on."""
    model_dir, prompts, loras, expected = setup
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=2,
              max_cpu_loras=4, max_model_len=256)
    engine = llm.llm_engine
    assert engine.add_lora(loras[0]) and engine.list_loras() == {loras[0].lora_int_id}
    misfit = LoRARequest("misfit", 9, str(misfit_adapter(loras[0].lora_path, tmp_path / "m")))
    with pytest.raises(ValueError, match="q_proj maps"):
        engine.add_lora(misfit)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    with pytest.raises(ValueError, match="q_proj maps"):
        llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False,
                     lora_request=misfit)
    reused = LoRARequest("other", loras[0].lora_int_id, loras[1].lora_path)
    with pytest.raises(ValueError, match="its own lora_int_id"):
        engine.add_lora(reused)
    out = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False,
                       lora_request=loras[0])
    assert out[0].outputs[0].token_ids == expected[loras[0].lora_int_id][0]
    assert engine.remove_lora(loras[0].lora_int_id)
    assert engine.list_loras() == set()
    assert not engine.remove_lora(loras[0].lora_int_id)
    # A request naming the removed adapter loads it again.
    out = llm.generate([{"prompt_token_ids": prompts[1]}], params, use_tqdm=False,
                       lora_request=loras[0])
    assert out[0].outputs[0].token_ids == expected[loras[0].lora_int_id][1]


def test_removed_adapter_serves_its_running_requests_first(setup):
    """remove_lora while requests run on the adapter: they finish with its exact tokens;
    the adapter is dropped once the last one ends."""
    model_dir, prompts, loras, expected = setup
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=2,
              max_model_len=256)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    lora = loras[1]
    for index, prompt in enumerate(prompts[:3]):
        engine.add_request(f"r{index}", {"prompt_token_ids": prompt}, params,
                           lora_request=lora)
    engine.step()
    engine.step()
    assert engine.remove_lora(lora.lora_int_id)
    assert lora.lora_int_id not in engine.list_loras()  # no new work is expected on it
    core = engine.engine_core.engine_core
    assert lora.lora_int_id in core.executor.list_loras()  # still held for its requests
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0].token_ids
    for index in range(3):
        assert finished[f"r{index}"] == expected[lora.lora_int_id][index]
    assert lora.lora_int_id not in core.executor.list_loras()
