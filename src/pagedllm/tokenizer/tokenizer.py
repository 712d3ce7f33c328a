"""Load a checkpoint's tokenizer, render chat templates, and report the EOS token.

Wraps transformers' AutoTokenizer for HF folders and for GGUF files (built from the GGUF
vocabulary metadata). Runs no model and does no incremental detokenization.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

_CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


def get_tokenizer(model_dir: str, gguf_file: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of an HF folder, or of a GGUF file inside `model_dir`.

    A GGUF's tokenizer is transformers' conversion of its vocabulary, with the chat template
    of its `tokenizer.chat_template` metadata, made once per file and then read back from
    the converted folder (model_loader/gguf_cache.py).
    """
    if gguf_file is None:
        return AutoTokenizer.from_pretrained(model_dir)
    from pagedllm.model_loader.gguf_cache import tokenizer_folder

    return AutoTokenizer.from_pretrained(tokenizer_folder(os.path.join(model_dir, gguf_file)))


def read_gguf_chat_template(gguf_path: str) -> str | None:
    """The `tokenizer.chat_template` string of a GGUF file, or None when it has none."""
    # Imported here: only GGUF users pay for the reader.
    from gguf import GGUFReader

    field = GGUFReader(gguf_path).get_field(_CHAT_TEMPLATE_KEY)
    return None if field is None else str(field.contents())


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render `messages` ([{"role": ..., "content": ...}, ...]) into a prompt string.

    Args:
        chat_template: a Jinja template that overrides the tokenizer's own.
        tools: OpenAI-style tool definitions, given to the template as `tools`.
        continue_final_message: leave the last message open (the model continues it).
        template_kwargs: more variables for the template.

    Raises:
        ValueError: when there is no template to use, or the messages are malformed.
    """
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            "This model has no chat template, so chat messages cannot be turned into a "
            "prompt. Pass chat_template=<Jinja template>, or send a plain text prompt "
            "(completions) instead of chat messages."
        )
    if isinstance(messages, (str, Mapping)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts.")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(
                f"messages[{index}] must be a dict with a 'role' key; got {message!r}."
            )
    prompt = tokenizer.apply_chat_template(
        [dict(message) for message in messages],
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tools=[dict(tool) for tool in tools] if tools else None,
        tokenize=False,
        **dict(template_kwargs or {}),
    )
    return str(prompt)


# Tokens that end a chat turn where the tokenizer's EOS is another token (llama.cpp treats
# them as end of generation too): Gemma's <end_of_turn>, Llama 3's <|eot_id|>, Phi-3's <|end|>.
_END_OF_TURN_TOKENS = ("<end_of_turn>", "<|eot_id|>", "<|end|>")


def get_end_of_turn_ids(
    tokenizer: PreTrainedTokenizerBase, hf_config: Any, eos_token_id: int | None
) -> tuple[int, ...]:
    """Ids besides `eos_token_id` that end generation (unless ignore_eos): the config's
    other EOS ids and the end-of-turn tokens above that the vocabulary has."""
    ids: list[int] = []
    eos = getattr(hf_config, "eos_token_id", None)
    for token_id in eos if isinstance(eos, (list, tuple)) else [eos]:
        if token_id is not None:
            ids.append(int(token_id))
    vocab = tokenizer.get_vocab()
    ids += [vocab[token] for token in _END_OF_TURN_TOKENS if token in vocab]
    return tuple(sorted({i for i in ids if i != eos_token_id}))


def get_eos_token_id(tokenizer: PreTrainedTokenizerBase, hf_config: Any) -> int | None:
    """The token id that ends generation: the tokenizer's EOS, else the config's (first) one."""
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return None if eos is None else int(eos)
