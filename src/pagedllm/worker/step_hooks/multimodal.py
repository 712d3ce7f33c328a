"""The runner's side of multimodal inputs: the vision encoder, its cache, and the merge.

Before each forward the hook drops the encoder cache entries the scheduler evicted, runs
the encoder for the items the scheduler scheduled (multimodal/encoder_cache.py decides
which and when), keeps their outputs by the item's hash, and gathers, for the step's
placeholder tokens, the output rows they take (`RunnerStep.mm_embeds`): the model puts
them in place of those tokens' text embeddings. An item whose tokens span several chunks
is encoded once; the same image in two requests (same hash) too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagedllm.core.sched_output import NewRequestData
from pagedllm.models.interfaces import MultiModalEmbeddings, SupportsMultiModal
from pagedllm.multimodal.inputs import MultiModalFeature
from pagedllm.multimodal.prompt_embeds import PROMPT_EMBEDS_MODALITY
from pagedllm.multimodal.tensor_data import feature_tensors, from_tensor_data
from pagedllm.worker.input_batch import CachedRequestState
from pagedllm.worker.step_hooks.base import RunnerStep, StepHook


class MultiModalHook(StepHook):
    """Encodes scheduled items into the encoder cache and places their rows in the step.

    Args:
        model: the vision-language model (its `encode`), or any causal LM when prompts
            come as embeddings (`enable_prompt_embeds`: their rows need no encoder).
        device: where the encoder runs.
    """

    def __init__(self, model: SupportsMultiModal, device: torch.device) -> None:
        self.model = model
        self.device = device
        # Item hash → its encoder output [num_embeds, hidden].
        self.encoder_cache: dict[str, torch.Tensor] = {}
        # M-RoPE models: request id → its prompt's [3, P] positions and the delta after it.
        self.uses_mrope = bool(getattr(model, "uses_mrope", False))
        self.mrope: dict[str, tuple[np.ndarray, int]] = {}

    def add_request(self, state: CachedRequestState, new: NewRequestData) -> None:
        """An M-RoPE model's request with images: its positions, computed once."""
        if self.uses_mrope and state.mm_features:
            items = [(f.offset, _grid(f), _seconds_per_grid(f)) for f in state.mm_features]
            self.mrope[state.request_id] = self.model.mrope_positions(  # type: ignore[attr-defined]
                state.num_prompt_tokens, items
            )

    def drop_requests(
        self, dropped: dict[str, CachedRequestState | None], swapped_out: set[int]
    ) -> None:
        """Forget their positions."""
        for request_id in dropped:
            self.mrope.pop(request_id, None)

    def before_forward(self, step: RunnerStep) -> None:
        """Free, encode, gather."""
        output = step.scheduler_output
        for identifier in output.free_encoder_mm_hashes:
            self.encoder_cache.pop(identifier, None)
        if output.scheduled_encoder_inputs:
            states = dict(zip(step.inputs.request_ids, step.states, strict=True))
            self._encode([
                states[request_id].mm_features[index]
                for request_id, indices in output.scheduled_encoder_inputs.items()
                for index in indices
            ])
        step.mm_embeds = self._gather(step)
        step.key_ends = _bidirectional_key_ends(step)
        if self.mrope and any(s.request_id in self.mrope for s in step.states):
            step.rope_positions = self._rope_positions(step)

    def _rope_positions(self, step: RunnerStep) -> np.ndarray:
        """[3, T] the step's M-RoPE positions: a prompt token's from its request's table,
        a later token's index + delta on every axis (text-only requests: the index)."""
        positions = np.asarray(step.inputs.positions, dtype=np.int64)
        rope = np.tile(positions, (3, 1))
        starts = step.inputs.query_start_loc
        for index, state in enumerate(step.states):
            entry = self.mrope.get(state.request_id)
            if entry is None:
                continue
            table, delta = entry
            rows = slice(int(starts[index]), int(starts[index + 1]))
            own = positions[rows]
            in_prompt = own < table.shape[1]
            rope[:, rows] = np.where(in_prompt, table[:, np.minimum(own, table.shape[1] - 1)],
                                     own + delta)
        return rope

    def _encode(self, features: list[MultiModalFeature]) -> None:
        """Run the encoder over the items not cached yet, a batch per modality."""
        by_modality: dict[str, list[MultiModalFeature]] = {}
        for feature in features:
            if feature.identifier not in self.encoder_cache:
                by_modality.setdefault(feature.modality, []).append(feature)
        for modality, todo in by_modality.items():
            unique = list({feature.identifier: feature for feature in todo}.values())
            if modality == PROMPT_EMBEDS_MODALITY:  # given: the rows are the item itself
                for feature in unique:
                    self.encoder_cache[feature.identifier] = (
                        feature_tensors(feature)["embeds"].to(self.device))
                continue
            items = [
                {name: t.to(self.device) for name, t in feature_tensors(feature).items()}
                for feature in unique
            ]
            for feature, embeds in zip(unique, self.model.encode(modality, items), strict=True):
                if embeds.shape[0] != feature.num_embeds:
                    raise RuntimeError(
                        f"The encoder gave {embeds.shape[0]} rows for a {modality} with "
                        f"{feature.num_embeds} placeholder tokens."
                    )
                self.encoder_cache[feature.identifier] = embeds

    def _gather(self, step: RunnerStep) -> MultiModalEmbeddings | None:
        """The step's placeholder rows and their encoder output rows (None: none)."""
        inputs = step.inputs
        rows: list[np.ndarray] = []
        values: list[torch.Tensor] = []
        for index, state in enumerate(step.states):
            if not state.mm_features:
                continue
            start = int(inputs.context_lens[index])
            end = start + int(inputs.query_lens[index])
            first_row = int(inputs.query_start_loc[index])
            for feature in _overlapping(state.mm_features, start, end):
                positions, embed_rows = _embed_positions(feature, start, end)
                if len(positions):
                    rows.append(first_row + positions - start)
                    values.append(self.encoder_cache[feature.identifier][embed_rows])
        if not rows:
            return None
        return MultiModalEmbeddings(
            step.to_device(np.concatenate(rows).astype(np.int64)), torch.cat(values)
        )


def _bidirectional_key_ends(step: RunnerStep) -> np.ndarray | None:
    """[T] key bounds where the step computes tokens of an item whose tokens attend to
    each other both ways (the scheduler puts such an item whole in one step); else None."""
    inputs = step.inputs
    key_ends = None
    for index, state in enumerate(step.states):
        start = int(inputs.context_lens[index])
        end = start + int(inputs.query_lens[index])
        for feature in _overlapping(state.mm_features, start, end):
            if not feature.bidirectional:
                continue
            if key_ends is None:
                key_ends = np.asarray(inputs.positions, dtype=np.int64) + 1
            first_row = int(inputs.query_start_loc[index])
            lo, hi = max(start, feature.offset), min(end, feature.end)
            key_ends[first_row + lo - start : first_row + hi - start] = feature.end
    return key_ends


def _grid(feature: MultiModalFeature) -> tuple[int, int, int]:
    """An item's (t, h, w) patch grid (an M-RoPE model's image or video)."""
    key = "image_grid_thw" if feature.modality == "image" else "video_grid_thw"
    t, h, w = (int(v) for v in from_tensor_data(feature.data[key]).reshape(3).tolist())
    return t, h, w


def _seconds_per_grid(feature: MultiModalFeature) -> float | None:
    """A video's seconds per temporal patch (Qwen2.5-VL's temporal positions); None for an
    image or a video without it."""
    seconds = feature.data.get("second_per_grid_ts")
    return None if seconds is None else float(from_tensor_data(seconds).reshape(-1)[0])


def _overlapping(
    features: Sequence[MultiModalFeature], start: int, end: int
) -> list[MultiModalFeature]:
    return [f for f in features if f.offset < end and f.end > start]


def _embed_positions(
    feature: MultiModalFeature, start: int, end: int
) -> tuple[np.ndarray, torch.Tensor]:
    """Prompt positions in [start, end) that take one of the item's rows, and those rows."""
    lo, hi = max(start, feature.offset), min(end, feature.end)
    positions = np.arange(lo, hi)
    if feature.is_embed is None:
        return positions, torch.from_numpy(positions - feature.offset)
    is_embed = np.asarray(feature.is_embed, dtype=bool)
    embed_index = np.cumsum(is_embed) - 1  # per span token: its row, where it takes one
    local = positions - feature.offset
    keep = is_embed[local]
    return positions[keep], torch.from_numpy(embed_index[local][keep])
