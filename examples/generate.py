"""The main job: generate on the default model (SmolLM2-135M-Instruct) and print the results.

Run with `make run` (installs everything on first use). Pass a model folder or .gguf file as
the first argument to use another model.
"""

from __future__ import annotations

import sys

from pagedllm import LLM, SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a KV cache is.",
    "List three primary colors.",
]


def main() -> None:
    """Chat-format each prompt, generate greedily, print prompt and completion."""
    model = sys.argv[1] if len(sys.argv) > 1 else None
    llm = LLM(model)
    params = SamplingParams(temperature=0.0, max_tokens=64)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    outputs = llm.chat(conversations, params)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        print(f"Prompt: {prompt!r}\nCompletion: {output.outputs[0].text!r}\n")


if __name__ == "__main__":
    main()
