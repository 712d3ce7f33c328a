"""Pipeline parallelism: which layers a stage holds, and what passes between stages.

A stage runs a contiguous range of decoder layers (`stage_layers`); every stage but the last
sends its residual stream (the last layer's output and the running residual) to the next as
`IntermediateTensors`, whose shapes both sides know from the step (tokens x hidden size), so
only the data travels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.distributed.parallel_state import GroupCoordinator


def stage_layers(num_layers: int, num_stages: int, stage: int) -> range:
    """The layers of `stage`: an even split, earlier stages taking one more when it does not
    divide (the last stage also runs the final norm and the LM head).

    Raises:
        ValueError: fewer layers than stages.
    """
    if num_layers < num_stages:
        raise ValueError(
            f"pipeline_parallel_size={num_stages} exceeds the model's {num_layers} layers."
        )
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


@dataclass
class IntermediateTensors:
    """The residual stream between two stages: the last layer's output (the model dtype)
    and the residual before it is added (float32, as the fused norms keep it)."""

    hidden_states: torch.Tensor
    residual: torch.Tensor

    def send(self, group: GroupCoordinator, dtype: torch.dtype) -> None:
        """Send both to the next stage."""
        group.send_next([self.hidden_states.to(dtype), self.residual.float()])

    @classmethod
    def recv(
        cls, group: GroupCoordinator, num_tokens: int, hidden_size: int, dtype: torch.dtype,
        device: torch.device,
    ) -> IntermediateTensors:
        """Receive the previous stage's residual stream for `num_tokens` tokens."""
        hidden = torch.empty(num_tokens, hidden_size, dtype=dtype, device=device)
        residual = torch.empty(num_tokens, hidden_size, dtype=torch.float32, device=device)
        group.recv_previous([hidden, residual])
        return cls(hidden, residual)
