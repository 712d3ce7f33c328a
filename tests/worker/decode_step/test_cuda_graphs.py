"""Decode steps through the CUDA-graph runner's persistent buffers
(worker/decode_step/cuda_graphs.py).
(tests/cuda compares graphs on and off on a GPU; here the eager engine's tokens are
transformers', tested everywhere else.)

On CPU the runner replays by running the forward again on its buffers
(PAGEDLLM_EMULATE_CUDA_GRAPHS=1) with the Triton attention backend in Triton's interpreter:
this checks everything but the capture itself (tests/cuda/ captures on a GPU): batches
padded to the capture sizes, rows left over from a larger step reset to padding, the
metadata read from the buffers, and greedy tokens equal to the eager engine's and to
transformers'."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.worker.decode_step import DecodeBatch
from pagedllm.worker.decode_step.cuda_graphs import DecodeGraphs, default_capture_sizes
from tests.conftest import hf_greedy_tokens

PROMPTS = [[5, 9, 30, 2, 77], [100, 3, 3, 41, 8, 19, 60], [7] * 20, [11, 12], [200, 201, 202]]
# Different lengths: the decode batch shrinks from 5 to 1 as requests finish.
MAX_TOKENS = [12, 3, 7, 1, 9]


def test_default_capture_sizes_are_vllms_up_to_max_num_seqs() -> None:
    sizes = default_capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 35
    assert default_capture_sizes(512)[-3:] == [480, 496, 512]
    assert default_capture_sizes(1024)[-1] == 512
    assert default_capture_sizes(6) == [1, 2, 4, 6]  # the scheduler's largest batch too


def _generate(llm: LLM) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _graphs(llm: LLM) -> DecodeGraphs | None:
    return llm.llm_engine.engine_core.engine_core.executor.worker.model_runner.decode_step


@pytest.mark.usefixtures("triton_interpreter")
def test_replayed_decodes_equal_eager_and_transformers(tiny_llama_dir, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    monkeypatch.setenv("PAGEDLLM_EMULATE_CUDA_GRAPHS", "1")
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    want = [
        hf_greedy_tokens(reference, [p], n)[0] for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)
    ]
    eager = LLM(str(tiny_llama_dir), dtype="float32", max_num_seqs=8, enforce_eager=True,
                num_gpu_blocks_override=64, max_model_len=128)
    assert _graphs(eager) is None
    del eager

    llm = LLM(str(tiny_llama_dir), dtype="float32", max_num_seqs=4,
              num_gpu_blocks_override=64, max_model_len=128)
    graphs = _graphs(llm)
    assert graphs is not None and graphs.capture_sizes == [1, 2, 4]
    replayed: list[int] = []
    run = graphs.run

    def counting_run(batch):
        replayed.append(batch.num_rows)
        return run(batch)

    monkeypatch.setattr(graphs, "run", counting_run)
    assert _generate(llm) == want
    # The decode-only steps replayed: 4 requests at most (max_num_seqs; the request of one
    # token ends at its prefill), 3 (padded to 4), 2 and 1.
    assert replayed and max(replayed) == 4 and min(replayed) == 1 and 3 in replayed
    kv = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
    assert kv.get_num_free_blocks() == kv.num_usable_blocks


def test_graphs_need_a_capturable_backend(tiny_llama_dir, monkeypatch) -> None:
    """The torch backend builds host-side metadata per step: no graphs, eager steps."""
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "torch")
    monkeypatch.setenv("PAGEDLLM_EMULATE_CUDA_GRAPHS", "1")
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_num_seqs=4,
              num_gpu_blocks_override=64, max_model_len=128)
    assert _graphs(llm) is None


@pytest.mark.usefixtures("triton_interpreter")
def test_rows_of_a_larger_step_go_back_to_padding(tiny_llama_dir, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    monkeypatch.setenv("PAGEDLLM_EMULATE_CUDA_GRAPHS", "1")
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_num_seqs=8,
              num_gpu_blocks_override=64, max_model_len=128)
    graphs = _graphs(llm)
    assert graphs is not None
    ids = np.array([3, 4, 5, 6, 7])
    table = np.array([[1, 2], [3, 0], [4, 5], [6, 0], [7, 0]])
    with torch.inference_mode():  # as the model runner calls it
        hidden = graphs.run(DecodeBatch(
            ids, np.array([17, 3, 20, 9, 2]), np.array([33, 51, 68, 105, 114]), table
        ))
        assert hidden.shape[0] == 5
        graphs.run(DecodeBatch(ids[:2], np.array([18, 4]), np.array([34, 52]), table[:2, :1]))
    buffers = graphs.buffers
    assert buffers.input_ids[:2].tolist() == [3, 4] and buffers.seq_lens[:2].tolist() == [19, 5]
    # The narrower table of this step: its column, then zeros (the old column 1 cleared).
    assert buffers.block_tables[:2, 0].tolist() == [1, 3]
    assert not buffers.block_tables[:2, 1:].any()
    # Rows 2-4 are padding again: token 0 at position 0, one token of context, slot 0.
    for buffer in (buffers.input_ids, buffers.positions, buffers.slot_mapping):
        assert not buffer[2:].any()
    assert buffers.seq_lens[2:].eq(1).all() and not buffers.block_tables[2:].any()
    assert buffers.query_start_loc.tolist() == list(range(9))
