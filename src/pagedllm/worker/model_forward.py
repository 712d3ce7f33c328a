"""How the model runs a step's flattened batch, chosen once for the model and the ranks:

- `DecoderForward`: the model inside the forward context (attention metadata and KV
  caches), the final hidden states out;
- `PipelineStageForward`: one pipeline stage: the previous stage's residual stream in (but
  on the first), the next stage's out (but on the last, which returns hidden states);
- `EncoderForward`: an encoder (BERT) attends bidirectionally over the packed sequences
  and keeps no KV cache: no context, its sequences' lengths and token types instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from pagedllm.distributed.parallel_state import GroupCoordinator
from pagedllm.distributed.pipeline import IntermediateTensors
from pagedllm.layers.forward_context import ForwardContext, set_forward_context
from pagedllm.models.interfaces import MultiModalEmbeddings


@dataclass
class ForwardInputs:
    """A step's batch on the model's device.

    Attributes:
        input_ids / positions: [T] int64.
        context: attention metadata and KV caches (None for a model without a KV cache).
        query_lens: tokens of each sequence (an encoder's packed sequences).
        token_type_ids: [T] token types when a request has them, else None.
        mm_embeds: encoder outputs in place of image tokens' embeddings, or None.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    context: ForwardContext | None
    query_lens: list[int]
    token_type_ids: torch.Tensor | None = None
    mm_embeds: MultiModalEmbeddings | None = None

    def model_kwargs(self) -> dict[str, MultiModalEmbeddings]:
        """Keyword arguments only a vision-language model takes (none for a text step)."""
        return {} if self.mm_embeds is None else {"mm_embeds": self.mm_embeds}


class ModelForward(ABC):
    """Runs the model over a step's batch."""

    # Whether the model reads a forward context (attention metadata over the KV cache).
    uses_kv_cache = True

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @abstractmethod
    def __call__(self, inputs: ForwardInputs) -> torch.Tensor | None:
        """The final hidden states [T, hidden]; None when they went to another stage."""


class DecoderForward(ModelForward):
    """The whole model on one rank (or tensor-parallel ranks in step)."""

    def __call__(self, inputs: ForwardInputs) -> torch.Tensor:
        """The model in the forward context."""
        assert inputs.context is not None
        with set_forward_context(inputs.context):
            return self.model(  # [T, hidden]
                inputs.input_ids, inputs.positions, **inputs.model_kwargs()
            )


class PipelineStageForward(ModelForward):
    """This rank's stage of the layers; activations travel between stages."""

    def __init__(
        self, model: torch.nn.Module, pp_group: GroupCoordinator, hidden_size: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        super().__init__(model)
        self.pp_group = pp_group
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.device = device

    def __call__(self, inputs: ForwardInputs) -> torch.Tensor | None:
        """From the previous stage's residual stream (but the first), to the next stage
        (but the last, which returns the hidden states)."""
        assert inputs.context is not None
        intermediate = None
        if not self.pp_group.is_first_rank:
            intermediate = IntermediateTensors.recv(
                self.pp_group, inputs.input_ids.shape[0], self.hidden_size, self.dtype,
                self.device,
            )
        with set_forward_context(inputs.context):
            output = self.model(
                inputs.input_ids, inputs.positions, intermediate, **inputs.model_kwargs()
            )
        if isinstance(output, IntermediateTensors):
            output.send(self.pp_group, self.dtype)
            return None
        return output


class EncoderForward(ModelForward):
    """Bidirectional attention over the packed sequences; nothing is cached."""

    uses_kv_cache = False

    def __call__(self, inputs: ForwardInputs) -> torch.Tensor:
        """The encoder over its sequences' lengths and token types."""
        return self.model(
            inputs.input_ids, inputs.positions, inputs.query_lens, inputs.token_type_ids
        )  # [T, hidden]


def make_model_forward(
    model: torch.nn.Module, pp_group: GroupCoordinator, dtype: torch.dtype,
    device: torch.device,
) -> ModelForward:
    """The forward the model and the ranks call for."""
    if getattr(model, "is_encoder", False):
        return EncoderForward(model)
    if pp_group.world_size > 1:
        spec = getattr(model, "spec", None)  # decoders built from a DecoderSpec
        hidden_size = int(spec.hidden_size) if spec is not None else 0
        return PipelineStageForward(model, pp_group, hidden_size, dtype, device)
    return DecoderForward(model)
