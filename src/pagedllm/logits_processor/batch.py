"""The custom processors' view of a step: persistent rows, their changes, the logits in row
order.

A request keeps its row from the step it first samples until it leaves (finished,
preempted, or a step it does not sample in): vLLM's persistent batch. A leaving request's row
is filled by moving the last row into it, so rows stay dense; arrivals take the rows at the
end. Each step's logits (in the runner's order) are gathered into row order for the
processors and put back after.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pagedllm.logits_processor.interface import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)


class _OutputTokens(Sequence[int]):
    """A live view of a request's output token ids (they grow as it generates)."""

    def __init__(self, token_ids: list[int], num_prompt_tokens: int) -> None:
        self._token_ids = token_ids
        self._start = num_prompt_tokens

    def __len__(self) -> int:
        return len(self._token_ids) - self._start

    def __getitem__(self, index: Any) -> Any:
        return self._token_ids[self._start:][index]


class CustomLogitsProcessors:
    """The engine's plugin processors, and the rows they see.

    Args:
        classes: the processor classes (logits_processor/loader.py).
        engine_config: passed to each constructor (as vLLM passes its config).
        device: where the logits live.
        is_pin_memory: whether host buffers may be pinned (the platform says).
    """

    def __init__(self, classes: Sequence[type[LogitsProcessor]], engine_config: Any,
                 device: torch.device, is_pin_memory: bool = False) -> None:
        self.processors = [cls(engine_config, device, is_pin_memory) for cls in classes]
        self.argmax_invariant = all(p.is_argmax_invariant() for p in self.processors)
        self._rows: list[str] = []  # row -> request id

    def apply(self, states: Sequence[Any], logits: torch.Tensor) -> torch.Tensor:
        """`logits` (one row per state, in the runner's order) after every processor."""
        update = self._update_rows(states)
        for processor in self.processors:
            processor.update_state(update)
        position = {state.request_id: index for index, state in enumerate(states)}
        order = torch.tensor([position[request_id] for request_id in self._rows],
                             device=logits.device)
        batch = logits.index_select(0, order)
        for processor in self.processors:
            batch = processor.apply(batch)
        return logits.index_copy(0, order, batch)

    def _update_rows(self, states: Sequence[Any]) -> BatchUpdate | None:
        """Rows for this step's requests, as vLLM's persistent batch changes them: leavers
        free their rows, arrivals take the lowest free rows (or new ones at the end), and
        the rows left empty are filled by moving the last rows down."""
        present = {state.request_id for state in states}
        rows: list[str | None] = list(self._rows)
        removed = [row for row, request_id in enumerate(rows) if request_id not in present]
        for row in removed:
            rows[row] = None
        known = set(self._rows)
        added: list[AddedRequest] = []
        for state in states:
            if state.request_id in known:
                continue
            row = rows.index(None) if None in rows else len(rows)
            if row == len(rows):
                rows.append(None)
            rows[row] = state.request_id
            added.append((row, state.sampling_params,
                          state.token_ids[: state.num_prompt_tokens],
                          _OutputTokens(state.token_ids, state.num_prompt_tokens)))
        moved = []
        while None in rows:
            hole = rows.index(None)
            last = max(row for row, request_id in enumerate(rows) if request_id is not None) \
                if any(r is not None for r in rows) else -1
            if last < hole:
                del rows[hole:]  # only empty rows remain past the hole
                break
            moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
            rows[hole], rows[last] = rows[last], None
        self._rows = [request_id for request_id in rows if request_id is not None]
        if not (removed or added):
            return None
        return BatchUpdate(len(self._rows), removed, added, moved)
