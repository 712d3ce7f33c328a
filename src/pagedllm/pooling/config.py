"""PoolerConfig: how hidden states are pooled, as vLLM reads it.

From explicit overrides (`PoolerConfig(pooling_type="MEAN", normalize=True)`), else from a
sentence-transformers folder: `modules.json` lists the modules, its Pooling module's
`config.json` gives the pooling mode, a Normalize module turns on normalization, and
`sentence_bert_config.json` gives the longest input the model was trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

POOLING_TYPES = ("MEAN", "CLS", "LAST", "ALL", "STEP")

# sentence-transformers' Pooling modes → ours (the first one set wins, in this order).
_ST_MODES = (
    ("pooling_mode_cls_token", "CLS"),
    ("pooling_mode_mean_tokens", "MEAN"),
    ("pooling_mode_lasttoken", "LAST"),
)
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class PoolerConfig:
    """How a pooling model turns hidden states into its output (vLLM's fields).

    Attributes:
        pooling_type: MEAN, CLS, LAST, ALL (every token) or STEP (tokens at step tags);
            None: the model's default.
        normalize: L2-normalize embeddings (None: the model's default).
        softmax: softmax over class logits (None: the model's default).
        dimensions: keep the first `dimensions` values of an embedding (Matryoshka), then
            normalize if asked.
        step_tag_id: for STEP pooling, the token id whose positions are pooled.
    """

    pooling_type: str | None = None
    normalize: bool | None = None
    softmax: bool | None = None
    dimensions: int | None = None
    step_tag_id: int | None = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            kind = self.pooling_type.upper()
            if kind not in POOLING_TYPES:
                raise ValueError(
                    f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got "
                    f"{self.pooling_type!r}."
                )
            object.__setattr__(self, "pooling_type", kind)
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be at least 1, got {self.dimensions}.")

    def merged_over(self, defaults: PoolerConfig) -> PoolerConfig:
        """This config with its unset (None) fields taken from `defaults`."""
        fields = {
            name: getattr(self, name)
            for name in ("pooling_type", "normalize", "softmax", "dimensions", "step_tag_id")
            if getattr(self, name) is not None
        }
        return replace(defaults, **fields)


@dataclass(frozen=True)
class SentenceTransformersSetup:
    """What a sentence-transformers folder says about pooling and input length."""

    pooler_config: PoolerConfig
    max_seq_length: int | None


def read_sentence_transformers(model_dir: str | Path) -> SentenceTransformersSetup | None:
    """The pooling setup of a sentence-transformers folder, or None if it is not one.

    Raises:
        ValueError: for a Pooling mode this runner does not build (max, mean of sqrt len,
            weighted mean).
    """
    folder = Path(model_dir)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    types = [module.get("type", "") for module in modules]
    pooling_type = None
    for module in modules:
        if module.get("type") == _ST_POOLING:
            pooling_type = _pooling_mode(folder / module.get("path", "") / "config.json")
    normalize = _ST_NORMALIZE in types
    max_seq_length = None
    bert_config = folder / "sentence_bert_config.json"
    if bert_config.is_file():
        max_seq_length = json.loads(bert_config.read_text()).get("max_seq_length")
    return SentenceTransformersSetup(
        PoolerConfig(pooling_type=pooling_type, normalize=normalize), max_seq_length
    )


def _pooling_mode(config_file: Path) -> str | None:
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    for key, kind in _ST_MODES:
        if config.get(key):
            return kind
    unsupported = [key for key, value in config.items() if key.startswith("pooling_mode") and value]
    if unsupported:
        raise ValueError(
            f"{config_file}: pooling mode {', '.join(unsupported)} is not supported (use "
            "CLS, MEAN or LAST pooling)."
        )
    return None
