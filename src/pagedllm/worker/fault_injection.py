"""Faults injected into a model's forward for tests, off unless an environment variable asks.

PAGEDLLM_INJECT_NONFINITE_TOKEN_ID=N makes every position whose input token is N embed to
NaN. The NaN flows through that request's layers and KV cache like a real numerical fault
(an overflow, a bad weight row), while the other requests of the same batch never read it:
the test that one request's non-finite logits fail that request alone, also in a server
whose engine runs in another process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedllm import envs
from pagedllm.logger import init_logger

logger = init_logger(__name__)


def faults_requested() -> bool:
    """Whether the environment asks for a fault. The hook sits on the Python embedding, so
    the decode-step fast paths (the C stack's own lookup, replayed CUDA graphs) would never
    run it: the worker builds none while a fault is asked for."""
    return envs.inject_nonfinite_token_id() is not None


def install_fault_injection(model: nn.Module) -> None:
    """Hook the faults the environment asks for into `model` (nothing when none is asked)."""
    token_id = envs.inject_nonfinite_token_id()
    if token_id is None:
        return
    embedding = _token_embedding(model)
    if embedding is None:
        raise ValueError(
            "PAGEDLLM_INJECT_NONFINITE_TOKEN_ID is set but the model has no token embedding "
            "(model.embed_tokens) to inject into."
        )
    logger.warning("Fault injection: token id %d embeds to NaN.", token_id)

    def poison(_: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        input_ids = inputs[0]
        hit = input_ids == token_id
        if not bool(hit.any()):
            return output
        return output.masked_fill(hit.unsqueeze(-1), float("nan"))

    embedding.register_forward_hook(poison)


def _token_embedding(model: nn.Module) -> nn.Module | None:
    inner = getattr(model, "model", None)
    embedding = getattr(inner, "embed_tokens", None)
    return embedding if isinstance(embedding, nn.Module) else None
