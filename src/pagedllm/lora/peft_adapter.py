"""Reading a PEFT LoRA folder into per-module (A, B, scale), checking what it asks for.

adapter_config.json gives the rank, `lora_alpha`, `use_rslora` (scale alpha / sqrt(r)
instead of alpha / r) and the target modules; adapter_model.safetensors (or .bin) holds
`...layers.{i}.{self_attn|mlp}.{name}.lora_A.weight` [r, in] and `lora_B.weight` [out, r].
Supported targets: q/k/v/o_proj and gate/up/down_proj of the decoder layers (q/k/v and
gate/up land in the fused qkv_proj and gate_up_proj). Anything else that would change the
output (embeddings, lm_head, DoRA, LoRA biases, modules_to_save, alpha patterns,
fan_in_fan_out layouts, a rank above max_lora_rank) is refused with a ValueError, never
dropped. This module must not import the engine or the worker.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_WEIGHT_NAME = re.compile(
    r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$"
)


@dataclass
class LoRAModuleWeights:
    """One target module's adapter: delta(x) = scale * (x @ A^T) @ B^T.

    Attributes:
        lora_a: [r, in] float32.
        lora_b: [out, r] float32.
        scale: lora_alpha / r (rsLoRA: / sqrt(r)).
    """

    lora_a: torch.Tensor
    lora_b: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        """The module's rank."""
        return int(self.lora_a.shape[0])


@dataclass
class PeftAdapter:
    """A loaded adapter: (layer index, module name) → its weights."""

    name: str
    rank: int
    modules: dict[tuple[int, str], LoRAModuleWeights]
    path: str = ""


def read_adapter_config(path: str | Path) -> dict[str, Any]:
    """The folder's adapter_config.json.

    Raises:
        ValueError: when the folder or its adapter_config.json is missing.
    """
    config_file = Path(path) / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"LoRA path {str(path)!r} has no adapter_config.json.")
    with open(config_file) as handle:
        config: dict[str, Any] = json.load(handle)
    return config


def check_adapter_config(config: dict[str, Any], path: str, max_lora_rank: int) -> int:
    """Refuse what is not built; return the adapter's rank.

    Raises:
        ValueError: naming the unsupported field (or the rank over `max_lora_rank`).
    """
    where = f"LoRA adapter {path!r}"
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where} is a {config.get('peft_type')} adapter; only LORA is built.")
    if config.get("use_dora"):
        raise ValueError(f"{where} uses DoRA (use_dora), which is not built.")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise ValueError(f"{where} trains biases (bias={config.get('bias')!r}); not built.")
    if config.get("modules_to_save"):
        raise ValueError(
            f"{where} saves whole modules (modules_to_save={config['modules_to_save']}); "
            "not built."
        )
    if config.get("alpha_pattern"):
        raise ValueError(f"{where} has an alpha_pattern; per-module alphas are not built.")
    if config.get("fan_in_fan_out"):
        raise ValueError(f"{where} uses fan_in_fan_out (Conv1D layouts); not built.")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [m for m in SUPPORTED_MODULES + ("embed_tokens", "lm_head")
                   if re.fullmatch(targets, m) or re.search(targets, m)]
    unsupported = sorted(set(targets) - set(SUPPORTED_MODULES))
    if unsupported:
        raise ValueError(
            f"{where} targets {unsupported}; LoRA is built for {', '.join(SUPPORTED_MODULES)}."
        )
    pattern_ranks = (config.get("rank_pattern") or {}).values()
    ranks = [int(config.get("r", 8)), *(int(r) for r in pattern_ranks)]
    rank = max(ranks)
    if rank > max_lora_rank:
        raise ValueError(f"{where} has rank {rank}, above max_lora_rank={max_lora_rank}.")
    return rank


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    safetensors_file = path / "adapter_model.safetensors"
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors_file))
    bin_file = path / "adapter_model.bin"
    if bin_file.is_file():
        loaded = torch.load(bin_file, map_location="cpu", weights_only=True)
        return {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}
    raise ValueError(
        f"LoRA path {str(path)!r} has no adapter_model.safetensors or adapter_model.bin."
    )


def load_peft_adapter(name: str, path: str, max_lora_rank: int) -> PeftAdapter:
    """Read and check a PEFT LoRA folder.

    Raises:
        ValueError: for a missing folder or file, an unsupported feature, a rank above the
            limit, or a tensor for a module LoRA is not built for.
    """
    config = read_adapter_config(path)
    rank = check_adapter_config(config, path, max_lora_rank)
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    use_rslora = bool(config.get("use_rslora"))
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for tensor_name, tensor in _read_weights(Path(path)).items():
        match = _WEIGHT_NAME.search(tensor_name)
        if match is None or match.group(3) not in SUPPORTED_MODULES:
            raise ValueError(
                f"LoRA adapter {path!r} has a tensor for {tensor_name!r}; LoRA is built for "
                f"{', '.join(SUPPORTED_MODULES)} of the decoder layers."
            )
        key = (int(match.group(1)), match.group(3))
        halves.setdefault(key, {})[match.group(4)] = tensor.float()
    modules = {}
    for key, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {path!r} has only lora_{''.join(pair)} of {key}.")
        module_rank = int(pair["A"].shape[0])
        if pair["A"].dim() != 2 or pair["B"].dim() != 2 or pair["B"].shape[1] != module_rank:
            raise ValueError(
                f"LoRA adapter {path!r}: {key} has lora_A {tuple(pair['A'].shape)} and "
                f"lora_B {tuple(pair['B'].shape)}, not [r, in] and [out, r]."
            )
        if module_rank > max_lora_rank:
            raise ValueError(
                f"LoRA adapter {path!r} has rank {module_rank}, above "
                f"max_lora_rank={max_lora_rank}."
            )
        scale = alpha / (module_rank**0.5 if use_rslora else module_rank)
        modules[key] = LoRAModuleWeights(pair["A"], pair["B"], scale)
    return PeftAdapter(name, rank, modules, str(path))
