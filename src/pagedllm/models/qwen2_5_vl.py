"""Qwen2.5-VL: Qwen2-VL's design (qwen2_vl.py: patches, M-RoPE, the merger) with an
RMS-normed, SwiGLU tower that attends within windows of `window_size` pixels (patches
regrouped window by window, in units of merged 2 x 2 patches) except in the
`fullatt_block_indexes` blocks, which attend over whole frames."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from pagedllm.layers.activation import Activation
from pagedllm.models.qwen2_vl import (
    PatchEmbed,
    Qwen2VisionAttention,
    Qwen2VLForConditionalGeneration,
    VisionRotary,
    mrope_positions,
    patch_positions,
)
from pagedllm.models.spec import activation_of


class RMSNorm(nn.Module):
    """x / rms(x) * w, computed in float32."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised over the last dimension."""
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class GatedVisionMLP(nn.Module):
    """down(act(gate(x)) * up(x)), with biases."""

    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden)
        self.up_proj = nn.Linear(dim, hidden)
        self.down_proj = nn.Linear(hidden, dim)
        self.act = Activation(activation_of(act))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, dim] → [N, dim]."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Qwen25VisionBlock(nn.Module):
    """x + attn(norm1(x)), then + mlp(norm2(.)); RMS norms, gated MLP."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        dim = config.hidden_size
        self.norm1 = RMSNorm(dim)
        self.norm2 = RMSNorm(dim)
        self.attn = Qwen2VisionAttention(dim, config.num_heads)
        self.mlp = GatedVisionMLP(dim, config.intermediate_size, config.hidden_act)

    def forward(
        self, x: torch.Tensor, segments: list[int], cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """[N, dim] → [N, dim]."""
        x = x + self.attn(self.norm1(x), segments, cos, sin)
        return x + self.mlp(self.norm2(x))


class Qwen25PatchMerger(nn.Module):
    """RMS-norm each patch, then merge 2 x 2 neighbours into one token."""

    def __init__(self, out_dim: int, dim: int, merge: int) -> None:
        super().__init__()
        self.hidden = dim * merge * merge
        self.ln_q = RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU(),
                                 nn.Linear(self.hidden, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, dim] → [N / merge², out_dim]."""
        return self.mlp(self.ln_q(x).view(-1, self.hidden))


def window_order(
    grids: list[tuple[int, int, int]], merge: int, units_per_window: int
) -> tuple[np.ndarray, list[int]]:
    """The merged units regrouped window by window (frame by frame, windows row-major,
    units row-major inside), and each window's length in patches."""
    order, lengths, base = [], [], 0
    for t, h, w in grids:
        rows, cols = h // merge, w // merge
        units = np.arange(t * rows * cols).reshape(t, rows, cols) + base
        for frame in units:
            for top in range(0, rows, units_per_window):
                for left in range(0, cols, units_per_window):
                    window = frame[top : top + units_per_window, left : left + units_per_window]
                    order.append(window.reshape(-1))
                    lengths.append(window.size * merge * merge)
        base += t * rows * cols
    return np.concatenate(order), lengths


class Qwen25VisionTower(nn.Module):
    """Patches of several images (their grids given) → merged tokens, windowed."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        self.units_per_window = config.window_size // self.merge // config.patch_size
        self.full_blocks = set(config.fullatt_block_indexes)
        self.patch_embed = PatchEmbed(config, config.hidden_size)
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 1e4))
        self.rotary_pos_emb = VisionRotary(config.hidden_size // config.num_heads, theta)
        self.blocks = nn.ModuleList(Qwen25VisionBlock(config) for _ in range(config.depth))
        self.merger = Qwen25PatchMerger(config.out_hidden_size, config.hidden_size, self.merge)

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """[N, patch size] with (t, h, w) grids → [N / merge², out_dim]."""
        unit = self.merge * self.merge
        order, windows = window_order(grids, self.merge, self.units_per_window)
        index = torch.from_numpy(order).to(patches.device)
        positions = torch.from_numpy(patch_positions(grids, self.merge)).to(patches.device)
        cos, sin = self.rotary_pos_emb(positions)

        def regroup(x: torch.Tensor) -> torch.Tensor:
            return x.view(-1, unit, x.shape[-1])[index].reshape(-1, x.shape[-1])

        x = regroup(self.patch_embed(patches))
        cos, sin = regroup(cos), regroup(sin)
        frames = [h * w for t, h, w in grids for _ in range(t)]
        for number, block in enumerate(self.blocks):
            x = block(x, frames if number in self.full_blocks else windows, cos, sin)
        return self.merger(x)[torch.argsort(index)]


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):  # noqa: N801
    """HF `Qwen2_5_VLForConditionalGeneration` (images and video) over the paged KV
    cache."""

    def __init__(self, hf_config: Any) -> None:
        super(Qwen2VLForConditionalGeneration, self).__init__(hf_config)
        self.merge = hf_config.vision_config.spatial_merge_size
        self.visual = Qwen25VisionTower(hf_config.vision_config)  # type: ignore[assignment]
        self.tokens_per_second = float(getattr(hf_config.vision_config, "tokens_per_second", 1))

    def mrope_positions(
        self, num_prompt_tokens: int, items: list[tuple[int, tuple[int, int, int], float | None]]
    ) -> tuple[np.ndarray, int]:
        """As Qwen2-VL's, but a video's temporal positions step by tokens_per_second x its
        seconds per temporal patch (absolute time)."""
        return mrope_positions(num_prompt_tokens, [
            (offset, grid, 1.0 if seconds is None
             else float(np.float32(self.tokens_per_second) * np.float32(seconds)))
            for offset, grid, seconds in items
        ], self.merge)
