"""The scheduler's side of the encoder cache: which items' encoder outputs the model
runner holds, who still needs them, and which items a step encodes (pure Python).

As in vLLM v1, the encoder output of an image or video lives in the runner's cache, keyed
by the item's hash (`MultiModalFeature.identifier`), from the step that first schedules
any of its placeholder tokens until every request that needs it has computed past it.
Entries are reference-counted by request; an entry no request needs stays cached (a later
request with the same image reuses it) until its space is needed, and then the runner is
told to drop it (`take_freed`). Space is counted in embedding rows (`cache_size`); the
encoder's work per step in rows too (`compute_budget`, vLLM's encoder budget).

`EncoderScheduler.plan` decides, for a request's next chunk, which items must be encoded
and cuts the chunk before the first item that does not fit this step; a chunk may split an
item's tokens over steps because its output stays cached meanwhile, except for an item
whose tokens attend to each other both ways (`bidirectional`): its tokens are computed in
one step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pagedllm.multimodal.inputs import MultiModalFeature


class EncoderCacheManager:
    """Entries of the runner's encoder cache, their sizes and the requests using them.

    Args:
        cache_size: rows of encoder output the runner keeps at most.
    """

    def __init__(self, cache_size: int) -> None:
        self.cache_size = cache_size
        # identifier → rows, for every entry the runner holds.
        self.sizes: dict[str, int] = {}
        # identifier → ids of the requests that still need it (never empty).
        self.users: dict[str, set[str]] = {}
        # Entries nobody needs, oldest first: evicted when space is needed.
        self.unused: OrderedDict[str, None] = OrderedDict()
        # Evicted since the last take_freed(): the runner drops them.
        self.freed: list[str] = []

    @property
    def num_used_rows(self) -> int:
        """Rows held by entries some request needs."""
        return sum(self.sizes[identifier] for identifier in self.users)

    @property
    def usage(self) -> float:
        """Share of the cache held by entries some request needs, in [0, 1] (0 with no
        cache)."""
        return self.num_used_rows / self.cache_size if self.cache_size else 0.0

    @property
    def num_free_rows(self) -> int:
        """Rows free now or held by unused entries (evictable)."""
        return self.cache_size - self.num_used_rows

    def is_cached(self, identifier: str) -> bool:
        """True when the runner holds the item's encoder output."""
        return identifier in self.sizes

    def add_user(self, identifier: str, request_id: str) -> None:
        """`request_id` needs the cached entry `identifier` until it releases it."""
        self.unused.pop(identifier, None)
        self.users.setdefault(identifier, set()).add(request_id)

    def allocate(self, identifier: str, num_rows: int, request_id: str) -> None:
        """A new entry the runner computes this step, evicting unused ones for its space."""
        assert identifier not in self.sizes and num_rows <= self.num_free_rows
        free = self.cache_size - sum(self.sizes.values())
        while free < num_rows:
            evicted, _ = self.unused.popitem(last=False)
            free += self.sizes.pop(evicted)
            self.freed.append(evicted)
        self.sizes[identifier] = num_rows
        self.users[identifier] = {request_id}

    def release(self, identifier: str, request_id: str) -> None:
        """`request_id` no longer needs `identifier` (unknown pairs are ignored)."""
        users = self.users.get(identifier)
        if users is None or request_id not in users:
            return
        users.discard(request_id)
        if not users:
            del self.users[identifier]
            self.unused[identifier] = None

    def take_freed(self) -> list[str]:
        """The entries evicted since the last call (the runner drops them)."""
        freed, self.freed = self.freed, []
        return freed

    def reset(self) -> None:
        """Forget every unused entry (the runner is told to drop them)."""
        while self.unused:
            identifier, _ = self.unused.popitem(last=False)
            del self.sizes[identifier]
            self.freed.append(identifier)


@dataclass
class EncoderPlan:
    """A request's chunk as the encoder allows it.

    Attributes:
        num_new_tokens: the chunk's tokens (cut before an item that does not fit).
        to_encode: indices (into the request's features) of the items encoded this step.
    """

    num_new_tokens: int
    to_encode: list[int]


class EncoderScheduler:
    """Plans each step's encoder work within its budget and the cache's space. A model
    without an encoder gets one with no budget and no cache: its requests carry no items,
    so every call is a no-op, and one with items is refused (`check_fits`).

    Args:
        compute_budget: rows the encoder may produce in one step.
        cache_size: rows the runner's encoder cache holds.
    """

    def __init__(self, compute_budget: int, cache_size: int) -> None:
        self.compute_budget = compute_budget
        self.cache = EncoderCacheManager(cache_size)
        self.budget_left = compute_budget
        # request id → indices of the items it encodes in the step being scheduled.
        self.scheduled: dict[str, list[int]] = {}

    def start_step(self) -> None:
        """A new step: the whole budget again."""
        self.budget_left = self.compute_budget
        self.scheduled = {}

    def check_fits(self, request_id: str, features: Sequence[MultiModalFeature]) -> None:
        """Refuse a request with an item larger than the cache or the step's budget.

        Raises:
            ValueError: naming the item and the limit (a model without an encoder: any
                item).
        """
        if features and self.cache.cache_size == 0:
            raise ValueError(f"Request {request_id!r} has images or video; this model reads "
                             "text only.")
        limit = min(self.compute_budget, self.cache.cache_size)
        for index, feature in enumerate(features):
            if feature.num_embeds > limit:
                raise ValueError(
                    f"Request {request_id!r}: {feature.modality} {index} takes "
                    f"{feature.num_embeds} embedding tokens, more than the encoder budget of "
                    f"{limit} per step; raise max_num_batched_tokens or use a smaller input."
                )

    def plan(
        self, request_id: str, features: Sequence[MultiModalFeature], start: int,
        num_new_tokens: int,
    ) -> EncoderPlan:
        """The chunk [start, start + num_new_tokens) cut to what the encoder allows now,
        and the items to encode for it."""
        end = start + num_new_tokens
        to_encode: list[int] = []
        planned: set[str] = set()
        needed = 0
        relied_on = 0  # rows of unused entries this chunk reuses: not evictable for it
        for index, feature in enumerate(features):
            if feature.offset >= end:
                break
            if feature.end <= start:
                continue  # computed already (or a prefix-cache hit)
            if feature.bidirectional and feature.end > end:
                end = start if feature.offset < start else feature.offset
                break  # its tokens go in one step: not this one
            if feature.identifier in planned:
                continue  # the same item earlier in this chunk
            if self.cache.is_cached(feature.identifier):
                if feature.identifier in self.cache.unused:
                    relied_on += self.cache.sizes[feature.identifier]
                continue
            rows = feature.num_embeds
            fits_budget = needed + rows <= self.budget_left
            if not fits_budget or needed + rows > self.cache.num_free_rows - relied_on:
                end = max(start, feature.offset)
                break
            to_encode.append(index)
            planned.add(feature.identifier)
            needed += rows
        return EncoderPlan(end - start, to_encode)

    def commit(
        self, request_id: str, features: Sequence[MultiModalFeature], start: int,
        plan: EncoderPlan,
    ) -> None:
        """The request runs its planned chunk: it holds the items the chunk reads."""
        end = start + plan.num_new_tokens
        # Reused entries first: allocating new ones must not evict them.
        for feature in features:
            overlaps = feature.offset < end and feature.end > start
            if overlaps and self.cache.is_cached(feature.identifier):
                self.cache.add_user(feature.identifier, request_id)
        for index in plan.to_encode:
            feature = features[index]
            self.cache.allocate(feature.identifier, feature.num_embeds, request_id)
            self.budget_left -= feature.num_embeds
            self.scheduled.setdefault(request_id, []).append(index)

    def release_consumed(
        self, request_id: str, features: Sequence[MultiModalFeature], num_computed: int
    ) -> None:
        """Release the items the request has computed past."""
        for feature in features:
            if feature.end <= num_computed:
                self.cache.release(feature.identifier, request_id)

    def release_all(self, request_id: str, features: Sequence[MultiModalFeature]) -> None:
        """The request finished or was preempted: it holds nothing."""
        for feature in features:
            self.cache.release(feature.identifier, request_id)
