"""OutputProcessor: output kinds, n > 1 aggregation, stop strings found in the frontend."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.engine.protocol import EngineCoreOutput
from pagedllm.request import FinishReason
from pagedllm.sampling_params import RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def _feed(processor, core_id, token_ids, finish_at_end=True):
    results = []
    for i, token in enumerate(token_ids):
        last = finish_at_end and i == len(token_ids) - 1
        reason = FinishReason.LENGTH if last else None
        out, abort = processor.process_outputs([EngineCoreOutput(core_id, [token], reason)])
        results.append((out, abort))
    return results


def test_delta_outputs_concatenate_to_final_text(tokenizer):
    text = "Le café coûte trois euros; 東京 🙂 done"
    ids = tokenizer.encode(text)
    processor = OutputProcessor(tokenizer)
    params = SamplingParams(output_kind=RequestOutputKind.DELTA, max_tokens=100)
    processor.add_request("r", None, [1, 2], params, ["r"])
    pieces = [out[0].outputs[0].text for out, _ in _feed(processor, "r", ids) if out]
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not processor.has_unfinished_requests()


def test_cumulative_and_final_only(tokenizer):
    ids = tokenizer.encode("The quick brown fox")
    processor = OutputProcessor(tokenizer)
    processor.add_request("c", None, [1], SamplingParams(max_tokens=50), ["c"])
    processor.add_request(
        "f", None, [1], SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY), ["f"]
    )
    cumulative = [out for out, _ in _feed(processor, "c", ids) if out]
    assert len(cumulative) == len(ids)
    assert cumulative[-1][0].outputs[0].text == "The quick brown fox"
    final = [out for out, _ in _feed(processor, "f", ids) if out]
    assert len(final) == 1 and final[0][0].finished and final[0][0].outputs[0].token_ids == ids


def test_stop_string_aborts_core_request_and_is_excluded(tokenizer):
    ids = tokenizer.encode("The quick brown fox jumps")
    processor = OutputProcessor(tokenizer)
    params = SamplingParams(stop=["brown"], output_kind=RequestOutputKind.DELTA, max_tokens=50)
    processor.add_request("s", None, [1], params, ["s"])
    results = _feed(processor, "s", ids, finish_at_end=False)
    aborts = [a for _, a in results if a]
    assert aborts == [["s"]]  # the core is told once
    texts = "".join(o[0].outputs[0].text for o, _ in results if o)
    assert texts == "The quick "
    final = [o[0] for o, _ in results if o and o[0].finished][0]
    assert final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == "brown"


def test_n_sequences_gathered_into_one_output(tokenizer):
    processor = OutputProcessor(tokenizer)
    params = SamplingParams(n=2, output_kind=RequestOutputKind.FINAL_ONLY, max_tokens=5)
    processor.add_request("p", "prompt", [1], params, ["0_p", "1_p"])
    out, _ = processor.process_outputs([EngineCoreOutput("1_p", [5], FinishReason.LENGTH)])
    assert out == []  # one sequence is still running
    out, _ = processor.process_outputs([EngineCoreOutput("0_p", [6], FinishReason.STOP)])
    assert len(out) == 1 and out[0].finished
    assert [(c.index, c.token_ids, c.finish_reason) for c in out[0].outputs] == [
        (0, [6], "stop"),
        (1, [5], "length"),
    ]


def test_abort_forgets_request(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request("a", None, [1], SamplingParams(n=2, temperature=1.0), ["0_a", "1_a"])
    assert sorted(processor.abort_requests(["a", "unknown"])) == ["0_a", "1_a"]
    assert processor.process_outputs([EngineCoreOutput("0_a", [5])]) == ([], [])
    assert not processor.has_unfinished_requests()
