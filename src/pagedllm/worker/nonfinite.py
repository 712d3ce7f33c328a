"""Finding the requests whose forward went non-finite, so that they alone fail.

A NaN or infinity in one request's hidden states stays in that request: attention reads only
its own context (padding reads the zeroed null block) and every other layer works row by row.
The runner checks the hidden states of the rows it samples from, [rows, hidden] values (the
vocabulary-wide logits would cost a pass over far more), and the scheduler ends the requests
found with finish_reason "error".
"""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.layers.nonfinite import finite_rows

__all__ = ["finite_rows", "nonfinite_rows", "owners_of_rows"]


def nonfinite_rows(finite: torch.Tensor) -> list[int]:
    """The indices of the False rows of `finite` (one host sync; the common all-finite case
    reads a single value)."""
    if bool(finite.numpy().all() if finite.is_cpu else finite.all()):
        return []
    return (~finite).nonzero().flatten().tolist()


def owners_of_rows(rows: list[int], row_starts: np.ndarray) -> list[int]:
    """The request index of each batch row, given each request's first row (sorted); each
    request listed once, in order."""
    owners = np.searchsorted(row_starts, np.asarray(rows, dtype=np.int64), side="right") - 1
    return sorted({int(owner) for owner in owners})
