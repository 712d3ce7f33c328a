"""Logits-processor plugins (vLLM v1's interface): a class given to `LLM(logits_processors=)`
as a class or a "module:Class" name edits every step's logits batch-wise, with per-request
arguments from SamplingParams.extra_args; its `validate_params` refuses bad arguments when a
request arrives; the rows it is told of (removed, added, moved) always match the logits'
rows; requests without arguments are untouched (greedy tokens as without the plugin)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.logits_processor import (
    BatchUpdate,
    CustomLogitsProcessors,
    LogitsProcessor,
    MoveDirectionality,
)

PROMPTS = [[5 + i, 17, 23, 9, 41 + i] for i in range(6)]


class TargetTokenProcessor(LogitsProcessor):
    """vLLM's test plugin: a request with extra_args["target_token"] may emit only it."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        target = (sampling_params.extra_args or {}).get("target_token")
        if target is not None and not isinstance(target, int):
            raise ValueError(f"target_token {target!r} is not int")

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.targets: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.targets.pop(row, None)
        for row, params, _, _ in batch_update.added:
            target = (params.extra_args or {}).get("target_token")
            if target is not None:
                self.targets[row] = target
            else:
                self.targets.pop(row, None)
        for source, dest, kind in batch_update.moved:
            assert kind == MoveDirectionality.UNIDIRECTIONAL
            if source in self.targets:
                self.targets[dest] = self.targets.pop(source)
            else:
                self.targets.pop(dest, None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, target in self.targets.items():
            keep = logits[row, target].item()
            logits[row].fill_(float("-inf"))
            logits[row, target] = keep
        return logits


def _run(llm, targets):
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                             extra_args=None if t is None else {"target_token": t})
              for t in targets]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def baseline(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128)
    try:
        return _run(llm, [None] * len(PROMPTS))
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("spec", [
    TargetTokenProcessor, "tests.logits_processor.test_plugins:TargetTokenProcessor"])
def test_plugin_edits_only_requests_with_arguments(tiny_llama_dir, baseline, spec):
    # A small token budget staggers the requests, so rows come and go between steps.
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=128, logits_processors=[spec],
              max_num_seqs=3, max_num_batched_tokens=12)
    try:
        targets = [None, 77, None, 101, 77, None]
        got = _run(llm, targets)
        for tokens, target, plain in zip(got, targets, baseline, strict=True):
            assert tokens == ([target] * 6 if target is not None else plain)
        with pytest.raises(ValueError, match="is not int"):
            llm.generate("x", SamplingParams(extra_args={"target_token": "seven"}),
                         use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("spec, text", [
    ("no_such_module_xyz:Proc", "cannot import"),
    ("tests.logits_processor.test_plugins:Missing", "has no 'Missing'"),
    (dict, "not a subclass"),
])
def test_bad_plugins_are_value_errors(tiny_llama_dir, spec, text):
    with pytest.raises(ValueError, match=text):
        LLM(str(tiny_llama_dir), logits_processors=[spec])


def test_plugins_with_speculative_decoding_are_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="speculative_config"):
        LLM(str(tiny_llama_dir), logits_processors=[TargetTokenProcessor],
            speculative_config={"method": "ngram", "num_speculative_tokens": 2})


class _Mirror(LogitsProcessor):
    """Replays the batch updates on a list of request ids and checks it against the rows."""

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.rows: list[str | None] = []

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.rows[row] = None
        for row, params, prompt, output in batch_update.added:
            while len(self.rows) <= row:
                self.rows.append(None)
            assert self.rows[row] is None, "an arrival overwrote a request"
            self.rows[row] = params.extra_args["id"]
            assert list(prompt) == [1, 2] and len(output) == len(params.extra_args["out"])
        for source, dest, _ in batch_update.moved:
            self.rows[dest], self.rows[source] = self.rows[source], None
        self.rows = self.rows[: batch_update.batch_size]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        # Each logits row holds its request's number: the rows must be in the told order.
        assert [f"r{int(v)}" for v in logits[:, 0].tolist()] == self.rows
        return logits


def test_rows_follow_every_batch_change():
    custom = CustomLogitsProcessors([_Mirror], None, torch.device("cpu"))
    rng = random.Random(0)
    live: list[str] = []
    for step in range(200):
        live = [r for r in live if rng.random() > 0.3]
        live += [f"r{step * 10 + i}" for i in range(rng.randint(0, 3))]
        rng.shuffle(live)  # the runner's order need not be the rows' order
        states = [SimpleNamespace(
            request_id=r, num_prompt_tokens=2, token_ids=[1, 2, 9],
            sampling_params=SamplingParams(extra_args={"id": r, "out": [9]})) for r in live]
        if not states:
            continue
        logits = torch.tensor([[float(r[1:]), 0.0] for r in live])
        out = custom.apply(states, logits)
        assert torch.equal(out, logits)  # put back in the runner's order
        assert sorted(custom.processors[0].rows) == sorted(live)
