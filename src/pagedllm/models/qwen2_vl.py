"""Qwen2-VL: a ViT over 14 px patches of 2 frames (Conv3d), 2-D rotary positions inside the
tower, attention within each frame, 2 x 2 patches merged into one text token; the Qwen2
text model with multimodal RoPE (M-RoPE): an image's tokens take (temporal, height, width)
positions, the text after it continues from the image's largest position + 1
(`mrope_positions`). Images of any size (dynamic resolution): the processor sends patches
and each image's (t, h, w) grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.layers.activation import Activation
from pagedllm.layers.rotary import rope_config_of
from pagedllm.models.common import DecoderForCausalLM
from pagedllm.models.spec import DecoderSpec, RopeSpec, activation_of
from pagedllm.models.vision_language import VisionLanguageModel

_DEFAULT_MROPE_SECTION = (16, 24, 24)


class Qwen2VLTextModel(DecoderForCausalLM):
    """The Qwen2 decoder of Qwen2-VL, its RoPE multimodal."""

    def __init__(self, text_config: Any) -> None:
        theta, _ = rope_config_of(text_config)
        params = getattr(text_config, "rope_parameters", None) or {}
        section = tuple(params.get("mrope_section") or _DEFAULT_MROPE_SECTION)
        rope = RopeSpec(theta, None, None, section)
        spec = DecoderSpec.from_hf(
            text_config, qkv_bias=True, o_bias=False, mlp_bias=False,
            layer_ropes=(rope,) * text_config.num_hidden_layers,
        )
        super().__init__(spec)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) → (-x2, x1) over the last dimension's halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class VisionRotary(nn.Module):
    """Axial 2-D RoPE of the tower: half the frequencies follow the patch's row, half its
    column (computed in float32)."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        spatial = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N, 2] (row, column) → cos, sin [N, head_dim]."""
        freqs = positions[..., None].float() * self.inv_freq  # [N, 2, head_dim / 4]
        freqs = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        freqs = torch.cat([freqs, freqs], dim=-1)
        return freqs.cos(), freqs.sin()


class Qwen2VisionAttention(nn.Module):
    """Fused qkv (with bias), rotary, attention within each segment (a frame), proj."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, segments: list[int], cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """[N, dim] → [N, dim]."""
        num = x.shape[0]
        q, k, v = self.qkv(x).reshape(num, 3, self.num_heads, -1).unbind(1)  # [N, H, D]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(x.dtype)
        outs = []
        for qs, ks, vs in zip(q.split(segments), k.split(segments), v.split(segments),
                              strict=True):
            out = F.scaled_dot_product_attention(
                qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1)
            )  # [H, n, D]
            outs.append(out.transpose(0, 1).reshape(qs.shape[0], -1))
        return self.proj(torch.cat(outs))


class Qwen2VisionMLP(nn.Module):
    """fc1 → activation → fc2."""

    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = Activation(activation_of(act))
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, dim] → [N, dim]."""
        return self.fc2(self.act(self.fc1(x)))


class Qwen2VisionBlock(nn.Module):
    """x + attn(norm1(x)), then + mlp(norm2(.))."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        dim = config.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Qwen2VisionAttention(dim, config.num_heads)
        self.mlp = Qwen2VisionMLP(dim, int(dim * config.mlp_ratio), config.hidden_act)

    def forward(
        self, x: torch.Tensor, segments: list[int], cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """[N, dim] → [N, dim]."""
        x = x + self.attn(self.norm1(x), segments, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """Flattened (channels, frames, row, column) patches → embeddings (Conv3d, no bias)."""

    def __init__(self, config: Any, dim: int) -> None:
        super().__init__()
        self.shape = (config.in_channels, config.temporal_patch_size, config.patch_size,
                      config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, dim, kernel_size=self.shape[1:],
                              stride=self.shape[1:], bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[N, C * T * P * P] → [N, embed_dim]."""
        x = patches.view(-1, *self.shape).to(self.proj.weight.dtype)
        return self.proj(x).view(x.shape[0], -1)


class PatchMerger(nn.Module):
    """Norm each patch, then 2 x 2 neighbours (adjacent rows of the input) → one token."""

    def __init__(self, out_dim: int, dim: int, merge: int) -> None:
        super().__init__()
        self.hidden = dim * merge * merge
        self.ln_q = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU(),
                                 nn.Linear(self.hidden, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, dim] → [N / merge², out_dim]."""
        return self.mlp(self.ln_q(x).view(-1, self.hidden))


class Qwen2VisionTower(nn.Module):
    """Patches of several images (their grids given) → merged tokens."""

    def __init__(self, config: Any, out_dim: int) -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config, config.embed_dim)
        head_dim = config.embed_dim // config.num_heads
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 1e4))
        self.rotary_pos_emb = VisionRotary(head_dim, theta)
        self.blocks = nn.ModuleList(Qwen2VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(out_dim, config.embed_dim, self.merge)

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """[N, patch size] with (t, h, w) grids → [N / merge², out_dim]."""
        positions = torch.from_numpy(patch_positions(grids, self.merge)).to(patches.device)
        cos, sin = self.rotary_pos_emb(positions)
        segments = [h * w for t, h, w in grids for _ in range(t)]  # attention per frame
        x = self.patch_embed(patches)
        for block in self.blocks:
            x = block(x, segments, cos, sin)
        return self.merger(x)


def patch_positions(grids: list[tuple[int, int, int]], merge: int) -> np.ndarray:
    """[N, 2] (row, column) of every patch, in the processor's order: merge x merge blocks
    row-major, patches row-major inside each block, frames one after another."""
    rows = []
    for t, h, w in grids:
        hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        hpos = hpos.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        wpos = wpos.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        rows.append(np.tile(np.stack([hpos, wpos], axis=-1), (t, 1)))
    return np.concatenate(rows).astype(np.int64)


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    """HF `Qwen2VLForConditionalGeneration` (images and video) over the paged KV cache."""

    vision_modules = ("visual",)
    text_model_class = Qwen2VLTextModel
    uses_mrope = True

    def __init__(self, hf_config: Any) -> None:
        super().__init__(hf_config)
        self.merge = hf_config.vision_config.spatial_merge_size
        self.visual = Qwen2VisionTower(hf_config.vision_config, hf_config.text_config.hidden_size)

    def encode(
        self, modality: str, items: list[dict[str, torch.Tensor]]
    ) -> list[torch.Tensor]:
        """Images or videos (patches and their grid) → their tokens, all in one pass."""
        key = "pixel_values" if modality == "image" else "pixel_values_videos"
        grid_key = "image_grid_thw" if modality == "image" else "video_grid_thw"
        grids = [tuple(int(v) for v in item[grid_key].reshape(3).tolist()) for item in items]
        tokens = self.visual(torch.cat([item[key] for item in items]),
                             grids)  # type: ignore[arg-type]
        sizes = [t * h * w // (self.merge * self.merge) for t, h, w in grids]
        return list(tokens.split(sizes))

    def mrope_positions(
        self, num_prompt_tokens: int, items: list[tuple[int, tuple[int, int, int], float | None]]
    ) -> tuple[np.ndarray, int]:
        """The prompt's [3, P] positions and the delta of the tokens after it, from each
        item's (offset, (t, h, w) grid, a video's seconds per temporal patch) in prompt
        order (transformers' get_rope_index). Qwen2-VL's temporal positions step by one."""
        return mrope_positions(
            num_prompt_tokens, [(offset, grid, 1.0) for offset, grid, _ in items], self.merge
        )


def mrope_positions(
    num_prompt_tokens: int, items: list[tuple[int, tuple[int, int, int], float]], merge: int
) -> tuple[np.ndarray, int]:
    """Text tokens: three equal positions counting on; an item's tokens: (start +
    floor(t x interval), start + row, start + column) of its merged grid, the interval
    being its temporal step (1, or Qwen2.5-VL's for a video; float32 as transformers
    computes it); after it text resumes at start + max(rows, columns). The delta is the
    last position + 1 - P (later tokens: index + delta on all three axes)."""
    parts = []
    cursor = 0  # the prompt index reached
    position = 0  # the next text position
    for offset, (t, h, w), interval in items:
        if offset > cursor:
            parts.append(np.tile(np.arange(position, position + offset - cursor), (3, 1)))
            position += offset - cursor
        rows, cols = h // merge, w // merge
        steps = (np.arange(t, dtype=np.float32) * np.float32(interval)).astype(np.int64)
        grid_t, grid_h, grid_w = np.meshgrid(steps, np.arange(rows), np.arange(cols),
                                             indexing="ij")
        parts.append(np.stack([grid_t.reshape(-1), grid_h.reshape(-1), grid_w.reshape(-1)])
                     + position)
        cursor = offset + t * rows * cols
        position += max(rows, cols)
    if num_prompt_tokens > cursor:
        parts.append(np.tile(np.arange(position, position + num_prompt_tokens - cursor), (3, 1)))
    positions = np.concatenate(parts, axis=1).astype(np.int64)
    return positions, int(positions.max()) + 1 - num_prompt_tokens
