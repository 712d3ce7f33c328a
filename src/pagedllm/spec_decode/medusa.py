"""Medusa heads: k small heads over the target's last hidden state, head i guessing the
token i + 2 positions ahead (Cai et al., 2024). No KV cache, no extra forward pass.

Each head is `num_layers` residual blocks x + SiLU(W x + b) and its own projection to the
vocabulary; the drafts are the heads' top tokens (deterministic: verified by matching).
Both published layouts load: the original (`{i}.{j}.linear.weight`, `{i}.{L}.weight`,
optionally under `medusa_head.`) with `medusa_num_heads` / `medusa_num_layers` in its config,
and vLLM's (`blocks.{i}.layers.{j}.weight`, `lm_heads.{i}.weight`) with `num_heads` /
`num_hidden_layers`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import nn

from pagedllm.spec_decode.checkpoint import read_config, read_tensors
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.proposers import DrafterContext, Proposal, ProposalInputs

_ORIGINAL_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_ORIGINAL_HEAD = re.compile(r"^(\d+)\.(\d+)\.weight$")
_VLLM_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_HEAD = re.compile(r"^lm_heads\.(\d+)\.weight$")


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, hidden] → [N, hidden]."""
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """`num_heads` heads of `num_layers` residual blocks and a vocabulary projection."""

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResidualBlock(hidden_size) for _ in range(num_layers)))
            for _ in range(num_heads)
        )
        self.lm_heads = nn.ModuleList(
            nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads)
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden] → [num_heads, N, vocab] logits."""
        return torch.stack(
            [head(block(hidden_states)) for block, head in zip(self.blocks, self.lm_heads,
                                                               strict=True)]
        )


def _our_name(name: str, num_layers: int) -> str | None:
    """A checkpoint tensor's name in MedusaHeads, or None if it is not a head's."""
    name = name.removeprefix("medusa_head.")
    if match := _VLLM_BLOCK.match(name):
        head, layer, kind = match.groups()
        return f"blocks.{head}.{layer}.linear.{kind}"
    if match := _VLLM_HEAD.match(name):
        return f"lm_heads.{match.group(1)}.weight"
    if match := _ORIGINAL_BLOCK.match(name):
        head, layer, kind = match.groups()
        return f"blocks.{head}.{layer}.linear.{kind}"
    if (match := _ORIGINAL_HEAD.match(name)) and int(match.group(2)) == num_layers:
        return f"lm_heads.{match.group(1)}.weight"
    return None


def load_medusa_heads(path: str, dtype: torch.dtype, device: torch.device) -> MedusaHeads:
    """The heads of a Medusa checkpoint folder (either layout).

    Raises:
        ValueError: for a folder without Medusa heads or with tensors that do not fit.
    """
    config = read_config(path)
    tensors = read_tensors(path)
    num_heads = config.get("medusa_num_heads", config.get("num_heads"))
    num_layers = config.get("medusa_num_layers", config.get("num_hidden_layers", 1))
    renamed = {}
    for name, tensor in tensors.items():
        ours = _our_name(name, num_layers)
        if ours is not None:
            renamed[ours] = tensor
    head_ids = {int(n.split(".")[1]) for n in renamed if n.startswith("lm_heads.")}
    if not head_ids:
        raise ValueError(f"speculative_config model {path!r} has no Medusa heads.")
    num_heads = num_heads or len(head_ids)
    vocab_size, hidden_size = renamed["lm_heads.0.weight"].shape
    with torch.device(device):
        heads = MedusaHeads(hidden_size, vocab_size, num_heads, num_layers)
    missing, unexpected = heads.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"Medusa checkpoint {path!r} does not fit {num_heads} heads of {num_layers} "
            f"layer(s): missing {missing}, unexpected {unexpected}."
        )
    return heads.to(dtype).eval().requires_grad_(False)


class MedusaProposer:
    """Drafts from Medusa heads over the hidden state that gave each row's last token."""

    def __init__(self, config: SpeculativeConfig, context: DrafterContext) -> None:
        assert config.model is not None
        self.heads = load_medusa_heads(config.model, context.dtype, context.device)
        num_heads = len(self.heads.lm_heads)
        if config.num_speculative_tokens > num_heads:
            raise ValueError(
                f"speculative_config num_speculative_tokens ({config.num_speculative_tokens})"
                f" is more than the Medusa checkpoint's {num_heads} heads."
            )
        self.k = config.num_speculative_tokens
        self.dtype = context.dtype
        target_spec = getattr(context.target, "spec", None)
        head_size = self.heads.lm_heads[0].in_features
        if target_spec is not None and head_size != target_spec.hidden_size:
            raise ValueError(
                f"The Medusa heads take hidden states of {head_size}, the target model has "
                f"{target_spec.hidden_size}."
            )

    def propose(self, inputs: ProposalInputs) -> Proposal:
        """The heads' top tokens for each proposing row."""
        rows = inputs.propose_rows
        if not rows:
            return Proposal([], [])
        index = torch.tensor([inputs.last_hidden_index(r) for r in rows])
        hidden = inputs.hidden_states[index.to(inputs.hidden_states.device)]  # [R, hidden]
        logits = self.heads(hidden.to(self.dtype))[: self.k]  # [k, R, vocab]
        drafts = logits.argmax(dim=-1).T.tolist()  # [R, k]
        return Proposal(drafts, [None] * len(rows))

    def forget(self, request_ids: Sequence[str]) -> None:
        """Nothing is kept per request."""
