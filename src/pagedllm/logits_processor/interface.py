"""vLLM v1's logits-processor plugin interface: a class that edits a whole batch's logits,
told of the batch's changes before each step.

A processor keeps per-request state by batch row. Before each sampling step the engine calls
`update_state` with the batch's changes since the previous step (None: no change), applied
in the order removed, added, moved; then `apply` with the logits, one row per request in
that row order. Per-request arguments travel in `SamplingParams.extra_args` (the server's
`vllm_xargs` field).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from pagedllm.sampling_params import SamplingParams


class MoveDirectionality(Enum):
    """How a moved row travels: to an empty row (UNIDIRECTIONAL) or trading places (SWAP)."""

    UNIDIRECTIONAL = auto()
    SWAP = auto()


# A request that left its row: the row index.
RemovedRequest = int
# A request that arrived: (row, its SamplingParams, its prompt's token ids, its output token
# ids: a live view that grows as the request generates).
AddedRequest = tuple[int, "SamplingParams", Sequence[int], Sequence[int]]
# A row that moved: (from, to, directionality).
MovedRequest = tuple[int, int, MoveDirectionality]


@dataclass(frozen=True)
class BatchUpdate:
    """The batch's changes since the previous step (apply removed, then added, then moved).

    Attributes:
        batch_size: rows after the changes.
        removed / added / moved: see the aliases above.
    """

    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """A batch-level logits processor (vLLM v1's `LogitsProcessor`).

    Args (of a subclass's constructor):
        vllm_config: the engine's configuration (pagedllm's EngineConfig).
        device: where the logits live.
        is_pin_memory: whether host buffers may be pinned.
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ValueError for a request whose arguments this processor cannot take (run
        when the request arrives; the server answers 400). Default: any is fine."""
        return None

    @abstractmethod
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        """Set the processor up for one engine."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The batch's logits, edited (in place or not): [batch_size, vocab]."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when it never changes a row's argmax (skipped for greedy-only steps)."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Take the batch's changes before a step (None: unchanged)."""
