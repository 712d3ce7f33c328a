"""ModelRunnerOutput: the worker's answer to a SchedulerOutput, as Python lists only.

`LogprobsLists` is also the wire form of logprobs (engine/protocol.py carries it to the
frontend unchanged), so it is a msgspec Struct of plain lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from pagedllm.distributed.kv_transfer.base import KVConnectorOutput
from pagedllm.metrics.stats import KVTransferCounts
from pagedllm.pooling.data import PooledData


class LogprobsLists(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Logprobs of consecutive positions of one request (one entry per scored token).

    Attributes:
        token_ids: [num_positions][1 + k]: the scored token (sampled, or the actual prompt
            token), then the k most likely tokens, best first.
        logprobs: [num_positions][1 + k] their logprobs, same order.
        ranks: [num_positions] rank of the scored token (1 = most likely; 1 + the number of
            tokens with a strictly larger logprob). The top-k have ranks 1..k by position.
        other_ranks: [num_positions][k] the ranks of the entries after the scored token, when
            they are not the top-k (a request's logprob_token_ids); empty otherwise.
    """

    token_ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    ranks: list[int] = []
    other_ranks: list[list[int]] = []

    def extend(self, other: LogprobsLists) -> None:
        """Append `other`'s positions after this one's."""
        self.token_ids.extend(other.token_ids)
        self.logprobs.extend(other.logprobs)
        self.ranks.extend(other.ranks)
        self.other_ranks.extend(other.other_ranks)

    def head(self, num_positions: int) -> LogprobsLists:
        """The first `num_positions` positions."""
        return LogprobsLists(
            self.token_ids[:num_positions],
            self.logprobs[:num_positions],
            self.ranks[:num_positions],
            self.other_ranks[:num_positions],
        )

    def __len__(self) -> int:
        return len(self.ranks)


@dataclass
class ModelRunnerOutput:
    """Tokens sampled in one step.

    Attributes:
        request_ids: every request scheduled this step, in batch order.
        sampled_token_ids: per request, the tokens sampled this step; empty for a request
            whose prompt is still being prefilled in chunks.
        logprobs: request id → logprobs of the token sampled this step, for requests that
            asked for logprobs (or need them for best_of).
        prompt_logprobs: request id → logprobs of prompt tokens 2..P, sent once, in the step
            that finishes the prompt (chunks are accumulated by the runner until then).
        pooler_output: request id → the pooled result of each pooling request run this step.
        spec_token_ids: request id → draft tokens proposed for its next step (speculative
            decoding; requests without drafts are absent).
        failed_request_ids: requests whose hidden states or logits at their sample rows
            were not finite: they get no token and the scheduler ends them with an error.
    """

    request_ids: list[str]
    sampled_token_ids: list[list[int]]
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    prompt_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    pooler_output: dict[str, PooledData] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    failed_request_ids: list[str] = field(default_factory=list)
    # A KV connector's traffic this step (None: no connector).
    kv_transfer: KVTransferCounts | None = None
    # A KV connector's asynchronous transfers that finished or failed (None: none).
    kv_connector_output: KVConnectorOutput | None = None
