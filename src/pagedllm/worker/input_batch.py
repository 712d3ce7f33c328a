"""Per-request state the worker keeps between steps, and the step's flattened inputs.

The worker learns each request once (NewRequestData) and then only diffs; it appends the
tokens it samples itself, so its copy of the token ids is always complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pagedllm.core.sched_output import NewRequestData
from pagedllm.request import CarriesRequestData, RequestData
from pagedllm.worker.outputs import LogprobsLists


@dataclass
class CachedRequestState(CarriesRequestData):
    """What the worker knows about one running request.

    `data` is what the request carries from the API (request.py RequestData), by
    reference; its fields read as attributes (CarriesRequestData).
    `in_progress_prompt_logprobs` accumulates prompt logprobs chunk by chunk; None when the
    request did not ask for them or they were already sent. A pooling request has
    `pooling_params` and is pooled, never sampled.
    """

    request_id: str
    data: RequestData
    token_ids: list[int]
    block_ids: list[list[int]]  # one block table per KV cache group
    num_computed_tokens: int
    in_progress_prompt_logprobs: LogprobsLists | None = None

    @classmethod
    def from_new(cls, new: NewRequestData) -> CachedRequestState:
        """The state of a request the scheduler sends in full (new, or resumed)."""
        return cls(
            request_id=new.request_id,
            data=new.data,
            token_ids=[*new.data.prompt_token_ids, *new.output_token_ids],
            block_ids=[list(table) for table in new.block_ids],
            num_computed_tokens=new.num_computed_tokens,
        )

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of the prompt."""
        return len(self.data.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + output tokens known so far."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Output tokens known so far."""
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass
class StepInputs:
    """The flattened batch of one step (NumPy, before moving to the device).

    Attributes:
        request_ids: batch order.
        input_ids / positions: [num_tokens].
        query_start_loc: [num_reqs + 1]; query_lens / context_lens: [num_reqs].
        block_tables: per KV cache group, [num_reqs, max_num_blocks].
        slot_mappings: per KV cache group, [num_tokens].
        sample_rows: batch rows whose last scheduled token ends the known sequence; only
            these produce a token this step (others are mid-prefill chunks or pooling).
        pooling_rows: batch rows of pooling requests (computed whole this step).
        draft_token_ids: per sample row, the drafts it verifies (speculative decoding):
            they are its last scheduled tokens, and it samples at each of them plus one.
    """

    request_ids: list[str]
    input_ids: np.ndarray
    positions: np.ndarray
    slot_mappings: list[np.ndarray]
    query_start_loc: np.ndarray
    query_lens: np.ndarray
    context_lens: np.ndarray
    block_tables: list[np.ndarray]
    sample_rows: list[int]
    pooling_rows: list[int]
    draft_token_ids: list[list[int]] = field(default_factory=list)

    @property
    def block_table(self) -> np.ndarray:
        """The block table of KV cache group 0 (the only one of most models)."""
        return self.block_tables[0]

    @property
    def slot_mapping(self) -> np.ndarray:
        """The slot mapping of KV cache group 0."""
        return self.slot_mappings[0]

    @property
    def has_drafts(self) -> bool:
        """True when some row verifies draft tokens this step."""
        return any(self.draft_token_ids)

    @property
    def num_drafts(self) -> np.ndarray:
        """[num_reqs] draft tokens verified by each batch row (0 for most)."""
        counts = np.zeros(len(self.request_ids), dtype=np.int64)
        for row, drafts in zip(self.sample_rows, self.draft_token_ids, strict=True):
            counts[row] = len(drafts)
        return counts

    @property
    def logits_indices(self) -> np.ndarray:
        """Positions in the flattened batch whose logits are sampled: the last token of
        every sampled row, preceded by one position per draft it verifies."""
        ends = self.query_start_loc[1:]
        if len(self.sample_rows) != len(ends):  # (else every row, in order)
            ends = ends[self.sample_rows]
        if not self.has_drafts:
            return ends - 1
        counts = np.array([len(d) + 1 for d in self.draft_token_ids], dtype=np.int64)
        first = np.repeat(ends - counts, counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return first + offsets
