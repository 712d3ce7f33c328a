"""csrc/lm_head.c (the LM head's greedy tail in C) decides as the torch tail it replaces:
the same top candidates, their float32 logits up to summation order, the same greedy token;
on every vector kernel variant this CPU runs, rows independent of their neighbours."""

from __future__ import annotations

import pytest
import torch

from pagedllm import kernels
from pagedllm.kernels.variants import runnable_variants
from pagedllm.layers import cpu_ops
from pagedllm.layers.cpu_tables import parts_matrix
from pagedllm.layers.embedding import REFINED_CANDIDATES, LMHead, VocabEmbedding
from pagedllm.layers.quantization import SplitWeight, W4A8Weight, quantize_w4a8, quantize_w8a8
from pagedllm.platform import cpu_platform
from pagedllm.platform.cpu_features import detect

pytestmark = pytest.mark.skipif(not cpu_ops.w4a8_available(), reason="no vector kernels here")
# Vector variants with their own byte dot products (amx_bf16 adds dense bf16 matmuls and the
# prefill attention on AMX's tiles to avx512_bf16's: the same arithmetic here).
VARIANTS = [v.name for v in runnable_variants(detect()) if v.simd and v.extends is None]
VOCAB, WIDTH = 1000, 96


def _weight(seed: int = 0) -> torch.Tensor:
    return torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _hidden(rows: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _torch_refine(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, k: int):
    """The torch tail: top-k of the logits, their float32 dot products."""
    ids = logits.float().topk(k, dim=-1).indices
    exact = torch.bmm(weight[ids].float(), hidden.float().unsqueeze(-1)).squeeze(-1)
    return ids, exact


@pytest.mark.parametrize("variant", VARIANTS)
def test_refine_top_finds_the_top_candidates_and_their_float32_logits(variant):
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        weight, hidden = _weight(), _hidden(7)
        logits = (hidden.float() @ weight.float().T).bfloat16()
        ids, exact = cpu_ops.refine_top(logits, hidden, weight, REFINED_CANDIDATES)
    want_ids, _ = _torch_refine(logits, hidden, weight, REFINED_CANDIDATES)
    # The same top logits, in descending order (which of equal logits at the boundary is
    # taken is torch's choice; ours, the lower id, is tested below).
    chosen = logits.gather(1, ids).float()
    assert torch.equal(chosen, logits.gather(1, want_ids).float().sort(-1, descending=True)[0])
    assert bool((chosen[:, :-1] >= chosen[:, 1:]).all())
    # Their logits recomputed in float32 (up to summation order).
    want_exact = torch.bmm(weight[ids].float(), hidden.float().unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(exact, want_exact, rtol=1e-6, atol=1e-5)


def test_refine_top_keeps_the_lower_ids_among_equal_logits():
    weight, hidden = _weight(), _hidden(2)
    logits = torch.zeros(2, VOCAB, dtype=torch.bfloat16)
    logits[1, 500] = 1.0  # one clear winner, then ties
    ids, _ = cpu_ops.refine_top(logits, hidden, weight, 4)
    assert ids[0].tolist() == [0, 1, 2, 3]
    assert ids[1].tolist() == [500, 0, 1, 2]


def test_refine_top_survives_rows_that_are_not_finite():
    weight, hidden = _weight(), _hidden(3)
    logits = (hidden.float() @ weight.float().T).bfloat16()
    logits[1] = float("nan")
    logits[2, :10] = float("inf")
    ids, _ = cpu_ops.refine_top(logits, hidden, weight, REFINED_CANDIDATES)
    assert bool(((ids >= 0) & (ids < VOCAB)).all())  # valid ids whatever the values
    assert set(ids[2].tolist()) <= set(range(10))


def test_refine_top_refuses_more_candidates_than_the_vocabulary():
    weight, hidden = _weight()[:4], _hidden(1)
    with pytest.raises(MemoryError, match="outside"):
        cpu_ops.refine_top(torch.zeros(1, 4, dtype=torch.bfloat16), hidden, weight, 5)


def _split(weight: torch.Tensor) -> SplitWeight:
    """A head stored as two byte dot-product weights summed (a split GGUF tensor)."""
    first = weight.float() * 0.75
    return SplitWeight(quantize_w4a8(first.bfloat16()),
                       quantize_w8a8((weight.float() - first).bfloat16()), VOCAB)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("form", ["w4a8", "w8a8", "split"])
def test_greedy_head_picks_what_the_torch_tail_picks(variant, form):
    weight = _weight(2)
    method = {"w4a8": quantize_w4a8, "w8a8": quantize_w8a8, "split": _split}[form](weight)
    parts = [method.first, method.second] if isinstance(method, SplitWeight) else [method]
    hidden = _hidden(9, seed=3)
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        logits = method.apply(hidden, None)
        tokens = cpu_ops.greedy_head(parts_matrix(parts), hidden, weight, REFINED_CANDIDATES)
        alone = [cpu_ops.greedy_head(parts_matrix(parts), hidden[i : i + 1], weight,
                                     REFINED_CANDIDATES).item() for i in range(9)]
    ids, exact = _torch_refine(logits, hidden, weight, REFINED_CANDIDATES)
    want = ids.gather(1, exact.argmax(-1, keepdim=True)).squeeze(1)
    assert torch.equal(tokens, want)
    assert tokens.tolist() == alone  # a row's token never depends on the others


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_head_marks_rows_that_are_not_finite(variant):
    weight = _weight(2)
    method = quantize_w4a8(weight)
    hidden = _hidden(5, seed=6)
    with cpu_platform().use_kernels(kernels.load_variant(variant)):
        clean = cpu_ops.greedy_head(parts_matrix([method]), hidden, weight, REFINED_CANDIDATES)
        hidden[1, 7] = float("nan")
        hidden[3, 0] = -float("inf")
        tokens = cpu_ops.greedy_head(parts_matrix([method]), hidden, weight, REFINED_CANDIDATES)
    assert tokens[[1, 3]].tolist() == [-1, -1]
    assert torch.equal(tokens[[0, 2, 4]], clean[[0, 2, 4]])  # the others as before


def _head() -> LMHead:
    embedding = VocabEmbedding(VOCAB, WIDTH)
    embedding.weight.data = _weight(4)
    head = LMHead(VOCAB, WIDTH, tie_to=embedding)
    head.process_weights_after_loading("int4", keep_dense=True)
    return head


def test_the_head_runs_its_greedy_tail_in_c_with_the_torch_tails_tokens(monkeypatch,
                                                                       dense_from_tokens):
    # The shortlist as W4A8 alone: the once-per-process crossover measurement (timed) may
    # find dense bf16 faster from a few rows (AMX; AVX2 kernels beside AVX-512 matmuls).
    dense_from_tokens("never")
    head = _head()
    assert isinstance(head.shortlist, W4A8Weight)
    hidden = _hidden(16, seed=5)
    assert head._greedy_kernel(hidden) is not None
    in_c = head.greedy_tokens(hidden)
    ranking = head(hidden, ranking_only=True)  # refined in C too (refine_top)
    monkeypatch.setenv("PAGEDLLM_FUSED_OPS", "torch")  # the torch tail
    assert head._greedy_kernel(hidden) is None
    assert torch.equal(head.greedy_tokens(hidden), in_c)
    assert torch.equal(ranking.argmax(-1), in_c)
    torch.testing.assert_close(head(hidden, ranking_only=True), ranking, rtol=1e-6, atol=1e-5)


def test_the_heads_greedy_tokens_mark_rows_that_are_not_finite_on_every_path(monkeypatch):
    head = _head()
    hidden = _hidden(4, seed=7)
    hidden[2, 5] = float("inf")
    in_c = head.greedy_tokens(hidden)
    assert in_c[2].item() == -1
    monkeypatch.setenv("PAGEDLLM_FUSED_OPS", "torch")  # torch's refinement
    assert torch.equal(head.greedy_tokens(hidden), in_c)
    dense = LMHead(VOCAB, WIDTH)  # float32, dense: a plain argmax
    dense.weight.data = _weight(4).float()
    tokens = dense.greedy_tokens(hidden.float())
    assert tokens[2].item() == -1 and bool((tokens[[0, 1, 3]] >= 0).all())


def test_the_greedy_tail_keeps_its_logits_buffer_across_steps():
    head = _head()
    if head._greedy_kernel(_hidden(6)) is None:  # (dense matmuls win 6 rows on this CPU)
        pytest.skip("the C greedy tail does not serve 6 rows here")
    first = head.greedy_tokens(_hidden(4, seed=8))
    scratch = head._greedy_scratch
    assert scratch is not None and scratch.numel() >= 4 * VOCAB
    assert torch.equal(head.greedy_tokens(_hidden(4, seed=8)), first)
    head.greedy_tokens(_hidden(2))
    assert head._greedy_scratch is scratch  # fewer rows: the same buffer
    head.greedy_tokens(_hidden(6))
    assert head._greedy_scratch.numel() >= 6 * VOCAB  # more rows: grown
    too_small = torch.empty(VOCAB, dtype=torch.bfloat16)
    matrix = head._greedy_kernel(_hidden(2))
    with pytest.raises(ValueError, match="scratch"):
        cpu_ops.greedy_head(matrix, _hidden(2), head.weight, REFINED_CANDIDATES, too_small)


def test_finite_rows_in_c_match_torch():
    x = _hidden(6)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    x[3, -1] = -float("inf")
    x[4] = 3e38  # large but finite (bfloat16 rounds it to its largest finite values)
    want = torch.isfinite(x).all(-1)
    assert torch.equal(cpu_ops.finite_rows(x), want)
    assert want.tolist() == [True, False, False, False, True, True]
    assert torch.equal(cpu_ops.finite_rows(x[::2]), want[::2])  # rows strided
