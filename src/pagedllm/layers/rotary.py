"""Rotary position embedding (RoPE), neox style, with cached cos/sin tables.

Supports the default frequencies plus "linear", "llama3" and Phi-3's "longrope" ("su")
scaling. Reads both
config spellings: transformers 5 `rope_parameters` and the older `rope_theta` +
`rope_scaling`. Applies rotations only; it knows nothing about attention or the KV cache.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from pagedllm.layers import cpu_ops


def rope_config_of(hf_config: Any) -> tuple[float, dict[str, Any] | None]:
    """(base theta, scaling dict or None) from an HF config, whichever spelling it uses."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        theta = float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
        rope_type = params.get("rope_type", params.get("type", "default"))
        return theta, (None if rope_type in (None, "default") else dict(params))
    theta = float(getattr(hf_config, "rope_theta", None) or 10000.0)
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        return theta, (None if rope_type in (None, "default") else dict(scaling))
    return theta, None


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, smooth between."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq  # [rotary_dim / 2]
    # 0 where the wavelength is short (keep), 1 where long (scale), linear ramp in between.
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smooth = smooth.clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def compute_inv_freq(rotary_dim: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """[rotary_dim / 2] float32 inverse frequencies, after optional scaling."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (base**exponents)
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(
        f"Unsupported rope scaling type {rope_type!r}; supported: default, linear, llama3, "
        "longrope."
    )


def _longrope_table(
    rotary_dim: int, max_position: int, base: float, scaling: dict[str, Any]
) -> torch.Tensor:
    """[max_position, rotary_dim] (cos | sin) of LongRoPE (Phi-3 "longrope" / "su").

    Frequencies are divided per dimension by `short_factor` for positions below
    `original_max_position_embeddings` and by `long_factor` from there on (transformers
    switches a whole sequence once it grows past that length; per position, a cached prefix
    keeps the rotation it was computed with). cos and sin are scaled by the attention factor,
    sqrt(1 + ln(factor) / ln(original)) unless the config gives one.
    """
    original = int(scaling["original_max_position_embeddings"])
    factor = float(scaling.get("factor") or 1.0)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    positions = torch.arange(max_position, dtype=torch.float32)
    tables = []
    for name, rows in (
        ("short_factor", positions[:original]),
        ("long_factor", positions[original:]),
    ):
        ext = torch.tensor(scaling[name], dtype=torch.float32)
        inv_freq = 1.0 / (ext * base**exponents)
        freqs = torch.outer(rows, inv_freq)
        tables.append(torch.cat([freqs.cos(), freqs.sin()], dim=-1) * attention_factor)
    return torch.cat(tables)


def _is_longrope(scaling: dict[str, Any] | None) -> bool:
    return scaling is not None and scaling.get("rope_type", scaling.get("type")) in (
        "longrope",
        "su",
    )


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE: the first and second halves of each head's rotary dims form pairs.

    One instance is shared by the layers of a model that rotate alike; it holds a
    [max_position, rotary_dim] table of (cos | sin) computed once in float32.
    """

    cos_sin_cache: torch.Tensor

    def __init__(
        self,
        head_size: int,
        max_position: int,
        base: float = 10000.0,
        scaling: dict[str, Any] | None = None,
        rotary_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim or head_size
        self.max_position = max_position
        if _is_longrope(scaling):
            assert scaling is not None
            cos_sin = _longrope_table(self.rotary_dim, max_position, base, scaling)
        else:
            inv_freq = compute_inv_freq(self.rotary_dim, base, scaling)  # [rotary_dim / 2]
            positions = torch.arange(max_position, dtype=torch.float32)
            freqs = torch.outer(positions, inv_freq)  # [max_position, rotary_dim / 2]
            cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [max_position, rotary_dim]
        # Not persistent: it is derived from the config, never read from checkpoints.
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)
        # The (cos, sin) of the last positions tensor seen: every layer of a step rotates by
        # the same positions, so the table lookup is done once per step, not once per layer.
        self._last: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_size)  # [T, heads, head_size]
        half = self.rotary_dim // 2
        x1 = x[..., :half]
        x2 = x[..., half : self.rotary_dim]
        parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]  # each [T, heads, half]
        if self.rotary_dim < self.head_size:
            parts.append(x[..., self.rotary_dim :])
        return torch.cat(parts, dim=-1).view(shape)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, H*D] (or [T, H, D]) and k [T, Hkv*D] by their positions [T].

        Returns new tensors of the input shapes; the inputs are not modified.
        """
        cos, sin = self._cos_sin(positions, query.dtype)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def forward_adjacent(
        self, positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k given side by side as qk [T, (H + Hkv) * D] (a fused QKV slice).

        One rotation over all H + Hkv heads instead of one for q and one for k. Returns q
        [T, H, D] and k [T, Hkv, D], views of one new tensor (bfloat16 on CPU: of `qk`
        itself, rotated in place by the fused op).
        """
        table = self.cos_sin_cache
        if cpu_ops.serves(qk) and positions.dtype == torch.int64 and table.dtype == torch.float32:
            # In place: qk is a slice of this step's fresh QKV output, read by nothing else.
            cpu_ops.rope_neox_(qk, positions, table, self.head_size)
            rotated = qk
        else:
            cos, sin = self._cos_sin(positions, qk.dtype)
            rotated = self._rotate(qk, cos, sin)  # [T, (H + Hkv) * D], contiguous
        heads = rotated.view(qk.shape[0], -1, self.head_size)
        return heads[:, :num_q_heads], heads[:, num_q_heads:]

    def _cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each [T, 1, rotary_dim / 2] in `dtype`; reused while `positions` is the same tensor."""
        last = self._last
        # Identity, not equality: holding the tensor keeps its id from being reused.
        if last is not None and last[0] is positions and last[1] == dtype:
            return last[2], last[3]
        cos, sin = self._lookup(positions)
        cos, sin = cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)
        self._last = (positions, dtype, cos, sin)
        return cos, sin

    def _lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The table's cos and sin rows of `positions` [T]: each [T, rotary_dim / 2]."""
        cos_sin = self.cos_sin_cache.index_select(0, positions)  # [T, rotary_dim]
        cos, sin = cos_sin.chunk(2, dim=-1)
        return cos, sin

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, rotary_dim={self.rotary_dim}"


class MRotaryEmbedding(RotaryEmbedding):
    """Qwen2-VL's multimodal RoPE: positions [3, T] (temporal, height, width); the
    rotary frequencies are split into `mrope_section` runs, run i following axis i % 3.
    Text tokens have three equal positions, which makes it plain RoPE: 1-D positions [T]
    are served as such (decode steps, text-only steps).
    """

    def __init__(
        self, head_size: int, max_position: int, base: float, mrope_section: tuple[int, ...]
    ) -> None:
        super().__init__(head_size, max_position, base)
        if sum(mrope_section) != self.rotary_dim // 2:
            raise ValueError(
                f"mrope_section {list(mrope_section)} must sum to half the head size "
                f"({self.rotary_dim // 2})."
            )
        self.axis_of_freq: torch.Tensor
        axes = [i % 3 for i, size in enumerate(mrope_section) for _ in range(size)]
        self.register_buffer("axis_of_freq", torch.tensor(axes), persistent=False)

    def forward_adjacent(
        self, positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As RotaryEmbedding, with positions [T] or [3, T]."""
        if positions.dim() == 1:
            return super().forward_adjacent(positions, qk, num_q_heads)
        cos, sin = self._cos_sin(positions, qk.dtype)
        heads = self._rotate(qk, cos, sin).view(qk.shape[0], -1, self.head_size)
        return heads[:, :num_q_heads], heads[:, num_q_heads:]

    def _lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [T] as RoPE; [3, T]: frequency i at the position of its axis."""
        if positions.dim() == 1:
            return super()._lookup(positions)
        tables = self.cos_sin_cache[positions]  # [3, T, rotary_dim]
        half = self.rotary_dim // 2
        index = self.axis_of_freq.view(1, 1, half).expand(1, positions.shape[1], half)
        return tables[..., :half].gather(0, index)[0], tables[..., half:].gather(0, index)[0]
