"""Logits-processor plugins (vLLM v1's interface): `LLM(logits_processors=[cls or
"module:Class"])` or `--logits-processors`, applied batch-wise to every step's logits, with
per-request arguments in `SamplingParams.extra_args` (the server's `vllm_xargs`). The model
runner calls `CustomLogitsProcessors`; the frontend calls each class's `validate_params`.
"""

from pagedllm.logits_processor.batch import CustomLogitsProcessors
from pagedllm.logits_processor.interface import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
)
from pagedllm.logits_processor.loader import ENTRY_POINT_GROUP, load_logits_processors

__all__ = [
    "ENTRY_POINT_GROUP", "AddedRequest", "BatchUpdate", "CustomLogitsProcessors",
    "LogitsProcessor", "MoveDirectionality", "MovedRequest", "RemovedRequest",
    "load_logits_processors",
]
