"""The scheduler's encoder cache and budget (multimodal/encoder_cache.py) and the
prefix-cache keys of blocks that hold image tokens (core/block_hash.py)."""

from __future__ import annotations

import pytest

from pagedllm.core.block_hash import update_request_block_hashes
from pagedllm.multimodal.encoder_cache import EncoderScheduler
from pagedllm.multimodal.inputs import MultiModalFeature
from pagedllm.request import Request, RequestData
from pagedllm.sampling_params import SamplingParams


def feature(identifier: str, offset: int, length: int, **kw) -> MultiModalFeature:
    return MultiModalFeature("image", identifier, offset, length, **kw)


def test_plan_encodes_items_in_the_chunk_and_splits_them():
    encoder = EncoderScheduler(compute_budget=32, cache_size=32)
    items = [feature("a", 2, 10), feature("b", 20, 10)]
    plan = encoder.plan("r", items, start=0, num_new_tokens=8)
    assert plan.num_new_tokens == 8 and plan.to_encode == [0]  # "a" split: cached meanwhile
    encoder.commit("r", items, 0, plan)
    assert encoder.scheduled == {"r": [0]} and encoder.budget_left == 22
    encoder.start_step()
    plan = encoder.plan("r", items, start=8, num_new_tokens=16)
    assert plan.to_encode == [1]  # "a" is cached: only "b"
    encoder.commit("r", items, 8, plan)
    encoder.release_consumed("r", items, 24)
    assert "a" in encoder.cache.unused and "b" in encoder.cache.users


def test_budget_cuts_the_chunk_before_an_item_that_does_not_fit():
    encoder = EncoderScheduler(compute_budget=12, cache_size=64)
    items = [feature("a", 0, 10), feature("b", 12, 10)]
    plan = encoder.plan("r", items, start=0, num_new_tokens=30)
    assert plan.num_new_tokens == 12 and plan.to_encode == [0]


def test_bidirectional_item_is_never_split():
    encoder = EncoderScheduler(compute_budget=64, cache_size=64)
    items = [feature("a", 4, 10, bidirectional=True)]
    assert encoder.plan("r", items, 0, 8).num_new_tokens == 4  # stops before it
    assert encoder.plan("r", items, 0, 14).num_new_tokens == 14  # whole


def test_unused_entries_are_evicted_for_space_and_reported():
    encoder = EncoderScheduler(compute_budget=20, cache_size=20)
    first = [feature("a", 0, 12)]
    encoder.commit("r1", first, 0, encoder.plan("r1", first, 0, 12))
    encoder.release_all("r1", first)
    assert encoder.cache.is_cached("a") and encoder.cache.take_freed() == []
    encoder.start_step()
    second = [feature("b", 0, 12)]
    plan = encoder.plan("r2", second, 0, 12)
    encoder.commit("r2", second, 0, plan)
    assert encoder.cache.take_freed() == ["a"]
    assert not encoder.cache.is_cached("a") and encoder.cache.is_cached("b")


def test_a_shared_image_is_encoded_once_and_held_by_both():
    encoder = EncoderScheduler(compute_budget=20, cache_size=20)
    items = [feature("same", 0, 12)]
    encoder.commit("r1", items, 0, encoder.plan("r1", items, 0, 12))
    plan = encoder.plan("r2", items, 0, 12)
    assert plan.to_encode == []  # cached by r1 in this very step
    encoder.commit("r2", items, 0, plan)
    assert encoder.cache.users["same"] == {"r1", "r2"}
    encoder.release_all("r1", items)
    assert encoder.cache.users["same"] == {"r2"}


def test_an_item_larger_than_the_budget_is_refused():
    encoder = EncoderScheduler(compute_budget=8, cache_size=8)
    with pytest.raises(ValueError, match="image 0 takes 10 embedding tokens"):
        encoder.check_fits("r", [feature("a", 0, 10)])


def _request(features: list[MultiModalFeature]) -> Request:
    data = RequestData([7] * 16, SamplingParams(max_tokens=1), mm_features=features)
    return Request("r", data)


def test_prefix_cache_keys_follow_the_image():
    same_a = update_request_block_hashes(_request([feature("img-a", 4, 6)]), 4)
    again_a = update_request_block_hashes(_request([feature("img-a", 4, 6)]), 4)
    other = update_request_block_hashes(_request([feature("img-b", 4, 6)]), 4)
    text = update_request_block_hashes(_request([]), 4)
    assert same_a == again_a  # the same image twice shares every block
    assert same_a[0] == other[0] == text[0]  # before the image: plain text
    assert same_a[1] != other[1] and same_a[1] != text[1]  # from its first block on
    assert same_a[3] != other[3]  # chained: blocks after it differ too


def test_without_chunked_prefill_a_cut_prompt_waits():
    """The encoder budget fits "a" only: chunked, the chunk stops before "b"; unchunked,
    the prompt waits whole for a step with room for both."""
    from pagedllm.core.admission import Candidate, EncoderInputs, Verdict
    from pagedllm.core.step_plan import StepPlan

    encoder = EncoderScheduler(compute_budget=12, cache_size=64)
    items = [feature("a", 0, 10), feature("b", 12, 10)]
    data = RequestData(list(range(3, 27)), SamplingParams(max_tokens=1), mm_features=items)
    for chunked, verdict, count in ((True, Verdict.ADMIT, 12), (False, Verdict.STOP, 24)):
        candidate = Candidate(Request("r", data), 0, num_new_tokens=24)
        check = EncoderInputs(encoder, chunked=chunked)
        assert check.check(candidate, StepPlan(token_budget=64)) is verdict
        assert candidate.num_new_tokens == count
