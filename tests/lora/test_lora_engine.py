"""Multi-LoRA end to end: four random PEFT adapters (made with peft) on tiny Llama and Qwen2
checkpoints; greedy float32 output equals transformers + peft token for token, with all four
and base requests mixed in one batch, chunked, and from the prefix cache."""

from __future__ import annotations

import random

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.lora.request import LoRARequest

MAX_TOKENS = 16
# (rank, alpha, targets, rsLoRA)
ADAPTERS = [
    (8, 16, ["q_proj", "v_proj"], False),
    (4, 8, ["q_proj", "k_proj", "v_proj", "o_proj"], False),
    (16, 32, ["gate_proj", "up_proj", "down_proj"], True),
    (8, 4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
     False),
]


def make_adapter(model_dir, out_dir, rank, alpha, targets, rslora, seed):
    """A random PEFT LoRA adapter (lora_B not zero, so it changes the output)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                        lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.05)
    model.save_pretrained(out_dir)
    return out_dir


def reference_tokens(model_dir, adapter_dir, prompts):
    """transformers (+ peft when an adapter is given) greedy continuations."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import hf_greedy_tokens

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).eval()
    return hf_greedy_tokens(model, prompts, MAX_TOKENS)


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


def test_decode_stack_steps_aside_for_lora_batches(setup, monkeypatch):
    """The C decode stack has no LoRA deltas: decode steps with an adapter run the Python
    layers (which add them), steps without one keep the stack."""
    from pagedllm.models.cpu_decode_stack import CpuDecodeStack

    model_dir, prompts, loras, _ = setup
    llm = LLM(str(model_dir), dtype="bfloat16", quantization="int4", enable_lora=True,
              max_model_len=128)
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    if model.model.cpu_decode_stack is None:
        pytest.skip("the decode stack is not built for this model on this machine")
    calls = []
    original = CpuDecodeStack.__call__
    monkeypatch.setattr(CpuDecodeStack, "__call__",
                        lambda self, *a: calls.append(1) or original(self, *a))
    params = SamplingParams(temperature=0.0, max_tokens=6)
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
    assert calls, "base decode steps use the stack"
    calls.clear()
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False,
                 lora_request=loras[0])
    assert not calls, "LoRA decode steps must not use the stack"
