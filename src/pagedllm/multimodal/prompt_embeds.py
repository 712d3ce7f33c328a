"""Prompts given as embeddings (vLLM's `prompt_embeds`): a [N, hidden] tensor the model
reads in place of N tokens' embeddings.

Such a prompt travels as one multimodal item spanning the whole prompt: N placeholder token
ids (0) with a feature whose "encoder" is the identity (the runner copies the rows in), so
the scheduler, the encoder cache and the prefix cache treat it as they treat an image: the
item's hash (of the tensor's dtype, shape and bytes) keys its rows, and prompts with the
same embeddings share prefix-cache blocks while others never do.
"""

from __future__ import annotations

import hashlib

import torch

from pagedllm.multimodal.inputs import MultiModalFeature
from pagedllm.multimodal.tensor_data import to_tensor_data

PROMPT_EMBEDS_MODALITY = "prompt_embeds"
# The token id the placeholders carry (never embedded: every row is replaced).
PLACEHOLDER_TOKEN_ID = 0
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def prompt_embeds_item(embeds: object, hidden_size: int, max_model_len: int
                       ) -> tuple[list[int], MultiModalFeature]:
    """The placeholder ids and the item of a `prompt_embeds` tensor (ValueError naming
    what is wrong with it)."""
    if not isinstance(embeds, torch.Tensor):
        raise ValueError(f"prompt_embeds must be a torch.Tensor, got {type(embeds).__name__}.")
    if embeds.dim() == 3 and embeds.shape[0] == 1:
        embeds = embeds[0]  # a batch of one, as transformers' inputs_embeds
    if embeds.dim() != 2 or embeds.shape[1] != hidden_size:
        raise ValueError(f"prompt_embeds must have the shape [num_tokens, {hidden_size}] "
                         f"(the model's hidden size), got {list(embeds.shape)}.")
    num_tokens = embeds.shape[0]
    if num_tokens == 0:
        raise ValueError("The decoder prompt cannot be empty (prompt_embeds has no rows).")
    if num_tokens >= max_model_len:
        raise ValueError(f"prompt_embeds has {num_tokens} rows; the model's maximum context "
                         f"length is {max_model_len} tokens.")
    if embeds.dtype not in _DTYPES:
        raise ValueError(f"prompt_embeds must be float32, bfloat16 or float16, got "
                         f"{embeds.dtype}.")
    if not bool(torch.isfinite(embeds).all()):
        raise ValueError("prompt_embeds holds NaN or infinite values.")
    data = to_tensor_data(embeds)
    digest = hashlib.sha256(f"{data.dtype}{data.shape}".encode())
    digest.update(data.data)
    feature = MultiModalFeature(
        modality=PROMPT_EMBEDS_MODALITY, identifier=f"embeds-{digest.hexdigest()}",
        offset=0, length=num_tokens, data={"embeds": data},
    )
    return [PLACEHOLDER_TOKEN_ID] * num_tokens, feature
